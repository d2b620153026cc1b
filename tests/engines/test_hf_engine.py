from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hymem_train.engines.base import PromptTooLongError, SamplingParams
from hymem_train.engines.hf import HFEngine
from hymem_train.engines.vllm_engine import VLLMEngine
from hymem_train.heldout import sampled_reverse_kl
from hymem_train.models import NOT_ROUTED, RoutingController, build_model
from hymem_train.models.tokenizer import default_tokenizer


@pytest.fixture(scope="module")
def tok():
    return default_tokenizer()


@pytest.fixture()
def engine(tok):
    torch.manual_seed(0)
    return HFEngine(build_model("tiny", seed=0), [tok.eos_token_id], tok.pad_token_id, max_model_len=256)


def _prompts(tok):
    return [
        tok.encode(t)
        for t in ["hi", "My dog is Rex and my cat is Luna.", "Alice moved to Paris in March 2024."]
    ]


def test_batched_equals_one_at_a_time(engine, tok):
    prompts = _prompts(tok)
    sps = [SamplingParams(max_tokens=10, temperature=0) for _ in prompts]
    batched = engine.generate(prompts, sps)
    for p, sp, b in zip(prompts, sps, batched, strict=True):
        (one,) = engine.generate([p], [sp])
        assert one.response_ids == b.response_ids
        np.testing.assert_allclose(one.logprobs, b.logprobs, atol=1e-4)
        np.testing.assert_array_equal(one.routed_experts_TLE, b.routed_experts_TLE)


def test_logprobs_are_raw_model_logprobs_of_sampled_tokens(engine, tok):
    p = _prompts(tok)[1]
    (out,) = engine.generate([p], [SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9, seed=3)])
    seq = torch.tensor([p + out.response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(engine.model(seq).logits[0].float(), -1)
    ref = [float(logp[len(p) - 1 + j, t]) for j, t in enumerate(out.response_ids)]
    np.testing.assert_allclose(out.logprobs, ref, atol=1e-4)


def test_engine_routes_replay_into_a_training_forward(engine, tok):
    """The routes the engine returns, replayed in a teacher-forced forward, are the routes that forward picks."""
    p = _prompts(tok)[2]
    (out,) = engine.generate([p], [SamplingParams(max_tokens=8, temperature=1.0, seed=0)])
    routes = out.routed_experts_TLE
    assert routes.shape == (len(p) + len(out.response_ids), 2, 2)
    assert (routes[-1] == NOT_ROUTED).all() and (routes[:-1] >= 0).all()
    seq = torch.tensor([p + out.response_ids])
    ctl = RoutingController.attach(engine.model)
    with torch.no_grad(), ctl.capture() as rec:
        free = engine.model(seq).logits
    np.testing.assert_array_equal(np.sort(rec.routes_TLK[:-1], -1), np.sort(routes[:-1], -1))
    with torch.no_grad(), ctl.replay(routes):
        replayed = engine.model(seq).logits
    torch.testing.assert_close(free, replayed)
    assert ctl.stats()["moe/replay_mismatch_rate"] == 0.0


def test_seeded_sampling_is_reproducible_and_seeds_differ(engine, tok):
    p = _prompts(tok)[0]
    a = engine.generate(
        [p, p], [SamplingParams(max_tokens=16, seed=1), SamplingParams(max_tokens=16, seed=2)]
    )
    b = engine.generate([p], [SamplingParams(max_tokens=16, seed=1)])
    assert a[0].response_ids == b[0].response_ids
    assert a[0].response_ids != a[1].response_ids


def test_finish_reasons(engine, tok):
    p = _prompts(tok)[0]
    (o,) = engine.generate([p], [SamplingParams(max_tokens=5, temperature=0)])
    assert o.finish_reason == "length" and len(o.response_ids) == 5
    first = o.response_ids[0]
    (s,) = engine.generate([p], [SamplingParams(max_tokens=5, temperature=0, stop_token_ids=[first])])
    assert s.finish_reason == "stop" and s.response_ids == [first]
    assert s.routed_experts_TLE.shape[0] == len(p) + 1


def test_prompt_too_long_and_bad_params(engine):
    with pytest.raises(PromptTooLongError, match="max_model_len 256"):
        engine.generate([[5] * 250], [SamplingParams(max_tokens=10)])
    with pytest.raises(ValueError, match="top_p"):
        engine.generate([[5]], [SamplingParams(top_p=0)])
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], [SamplingParams()])


def test_topk_logprobs_match_full_forward(engine, tok):
    seq = _prompts(tok)[1]
    (tk,) = engine.topk_logprobs([seq], k=5, position_chunk=4)
    with torch.no_grad():
        logp = torch.log_softmax(engine.model(torch.tensor([seq])).logits[0].float(), -1)
    v, i = torch.topk(logp, 5, -1)
    torch.testing.assert_close(tk.logprobs_TK, v)
    assert torch.equal(tk.ids_TK, i)


def test_token_logprobs_are_the_next_tokens_raw_logprobs(engine, tok):
    seq = _prompts(tok)[1]
    (lp,) = engine.token_logprobs([seq], position_chunk=3)
    with torch.no_grad():
        logp = torch.log_softmax(engine.model(torch.tensor([seq])).logits[0].float(), -1)
    want = logp[:-1].gather(1, torch.tensor(seq[1:])[:, None])[:, 0].numpy()
    assert lp.shape == (len(seq) - 1,)
    np.testing.assert_allclose(lp, want, atol=1e-6)


def test_sampled_reverse_kl_is_the_mean_log_ratio_at_the_students_samples(engine, tok):
    """The held-out KL for engines that cannot return a whole vocabulary (vLLM): on a student's own
    samples at temperature 1, the mean of log pi_s - log pi_t estimates the exact reverse KL."""
    tm = build_model("tiny", seed=3)
    with torch.no_grad():
        tm.lm_head.weight.mul_(40)  # a sharp teacher: a reverse KL well above the estimate's noise
    teacher = HFEngine(tm, [tok.eos_token_id], tok.pad_token_id, max_model_len=256)
    prompt = _prompts(tok)[2]
    n = 400  # one sampled token each: every sample comes from the same distribution
    outs = engine.generate([prompt] * n, [SamplingParams(max_tokens=1, seed=s) for s in range(n)])
    segs = [
        SimpleNamespace(
            prompt_ids=prompt,
            response_ids=o.response_ids,
            logprobs=o.logprobs,
            input_ids=prompt + o.response_ids,
        )
        for o in outs
    ]
    m = sampled_reverse_kl(segs, teacher.token_logprobs([s.input_ids for s in segs]))
    assert m["eval/num_positions"] == n
    with torch.no_grad():
        ls = torch.log_softmax(engine.model(torch.tensor([prompt])).logits[0, -1].float(), -1)
        lt = torch.log_softmax(tm(torch.tensor([prompt])).logits[0, -1].float(), -1)
    exact = float((ls.exp() * (ls - lt)).sum())
    sd = float((ls.exp() * ((ls - lt) - exact) ** 2).sum()) ** 0.5 / n**0.5  # the estimate's standard error
    assert exact > 10 * sd and abs(m["eval/reverse_kl_sampled"] - exact) < 4 * sd, (m, exact, sd)


def test_update_weights_loads_buckets_and_rejects_bad_names(engine, tok):
    other = build_model("tiny", seed=9)
    named = list(other.state_dict().items())
    n = sum(engine.update_weights(named[s : s + 7], version=3) for s in range(0, len(named), 7))
    assert n == len(named) and engine.policy_version == 3
    for k, v in other.state_dict().items():
        assert torch.equal(engine.model.state_dict()[k], v)
    with pytest.raises(KeyError, match="no parameter"):
        engine.update_weights([("nope.weight", torch.zeros(1))], version=4)
    name, t = named[0]
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights([(name, torch.zeros(3, 3))], version=4)
    assert engine.policy_version == 3


def test_sleep_frees_the_weights_and_a_woken_engine_serves_only_after_a_full_sync(engine, tok):
    """Colocated placement: the engine drops its weights while the trainer steps; after wake_up its
    weights are uninitialised memory until the sync has sent every one of them (silent failure serving-before-weights)."""
    prompts = _prompts(tok)
    sps = [SamplingParams(max_tokens=8, temperature=0) for _ in prompts]
    before = engine.generate(prompts, sps)
    params = dict(engine.model.named_parameters())
    nbytes = sum(p.numel() * p.element_size() for p in params.values())
    assert engine.sleep() == nbytes  # every parameter's storage is released
    assert all(p.numel() == 0 for p in engine.model.parameters())
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(prompts, sps)
    engine.wake_up()
    sd = {k: v.clone() for k, v in build_model("tiny", seed=0).named_parameters()}
    names = sorted(sd)
    engine.update_weights([(k, sd[k]) for k in names[:-2]], version=1)  # a sync that missed two weights
    with pytest.raises(RuntimeError, match=rf"2 weight\(s\) not sent since wake_up.*{names[-2]}"):
        engine.generate(prompts, sps)
    with pytest.raises(RuntimeError, match="not sent since wake_up"):
        engine.topk_logprobs(prompts, 5)
    engine.update_weights([(k, sd[k]) for k in names[-2:]], version=1)
    after = engine.generate(prompts, sps)
    assert [o.response_ids for o in after] == [o.response_ids for o in before]
    for a, b in zip(after, before, strict=True):
        np.testing.assert_array_equal(a.logprobs, b.logprobs)


def test_vllm_engine_absent_gives_clear_message():
    pytest.importorskip("transformers")
    try:
        import vllm  # noqa: F401

        pytest.skip("vLLM installed here")
    except ImportError:
        pass

    with pytest.raises(ImportError, match=r"\.\[vllm\]"):
        VLLMEngine("/nonexistent", [1])


def test_vllm_engine_never_returns_a_capturing_request_without_routes():
    """Silent failure empty-routes at request level (GPU path, no vLLM needed): a capturing engine whose request
    comes back without routed experts raises instead of yielding a segment with none."""
    eng = object.__new__(VLLMEngine)  # the parsing only; no vLLM behind it
    eng.capture_routes = True
    with pytest.raises(RuntimeError, match="returned no routed experts"):
        eng._routes(SimpleNamespace(routed_experts=None), prompt_len=3, num_ids=2)
    ok = eng._routes(SimpleNamespace(routed_experts=np.zeros((4, 2, 2))), prompt_len=3, num_ids=2)
    assert ok.shape == (5, 2, 2) and (ok[-1] == NOT_ROUTED).all()
    eng.capture_routes = False
    assert eng._routes(SimpleNamespace(routed_experts=None), prompt_len=3, num_ids=2) is None
