"""The gateway in front of an engine that batches continuously itself (vLLM's AsyncLLM; the vLLM tier runs
the real one): every request goes in as it arrives through `engine.submit`, never as a static batch.
Here the engine is the HF engine behind a thread per request, so requests overlap in it."""

import concurrent.futures as cf
import threading

import openai
import pytest
import torch

from hymem_train.engines.base import SamplingParams
from hymem_train.engines.hf import HFEngine
from hymem_train.gateway import Gateway, GatewayConfig, GatewayServer
from hymem_train.models import build_model
from hymem_train.models.tokenizer import default_tokenizer


class SubmitEngine:
    """Each request on its own thread, held at a barrier until `width` requests are inside: they overlap."""

    continuous_batching = True

    def __init__(self, inner: HFEngine, width: int):
        self.inner, self.max_model_len, self.policy_version = inner, inner.max_model_len, 0
        self.pool = cf.ThreadPoolExecutor(width)
        self.inside = threading.Barrier(width, timeout=30)

    def submit(self, prompt, params) -> cf.Future:
        def run():
            self.inside.wait()
            return self.inner.generate([prompt], [params])[0]

        return self.pool.submit(run)

    def generate(self, prompts, params):
        raise AssertionError("the gateway batched requests for an engine that batches continuously")


def test_requests_go_straight_into_a_continuously_batching_engine():
    width = 4
    torch.manual_seed(0)
    tok = default_tokenizer()
    inner = HFEngine(build_model("tiny", seed=0), [tok.eos_token_id], tok.pad_token_id, max_model_len=200)
    gw = Gateway(SubmitEngine(inner, width), tok, GatewayConfig(embeddings=False, batch_wait_ms=20))
    with GatewayServer(gw) as srv:
        creds = {}
        for i in range(width):
            creds[i] = gw.register(f"t{i}", f"b{i}")
            gw.set_chunk(f"t{i}", 0)

        def call(i):
            msgs = [{"role": "user", "content": f"Request {i}: my dog is Rex."}]
            c = openai.OpenAI(base_url=srv.base_url, api_key=creds[i], max_retries=0)
            return msgs, c.chat.completions.create(model="policy", messages=msgs, max_tokens=8, seed=i)

        with cf.ThreadPoolExecutor(width) as ex:
            replies = list(ex.map(call, range(width)))
    # the barrier opened only because all `width` requests were inside the engine at once
    assert gw.batcher.batch_sizes == [] and sorted(gw.batcher.in_flight_seen) == list(range(width))
    assert gw.metrics()["gateway/mean_in_flight"] == pytest.approx((width - 1) / 2)
    for i, (msgs, r) in enumerate(replies):  # segments stay token-exact and per trajectory
        (seg,) = gw.store.get(f"t{i}")
        assert seg.prompt_ids == tok.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        ids = seg.response_ids[:-1] if seg.finish_reason == "stop" else seg.response_ids
        assert tok.decode(ids) == r.choices[0].message.content
        assert r.usage.completion_tokens == len(seg.response_ids) == len(seg.logprobs)


class StampedEngine:
    """Outputs stamped with the version that sampled them (6) while the engine's own attribute says 7: a
    pool whose replica finished a sync before the pool's version moved, or the other way round."""

    def __init__(self, inner: HFEngine):
        self.inner, self.max_model_len, self.policy_version = inner, inner.max_model_len, 7

    def generate(self, prompts, params):
        outs = self.inner.generate(prompts, params)
        for o in outs:
            o.policy_version = 6
        return outs


def test_a_segment_carries_the_version_its_engine_stamped():
    tok = default_tokenizer()
    inner = HFEngine(build_model("tiny", seed=0), [tok.eos_token_id], tok.pad_token_id, max_model_len=200)
    (o,) = inner.generate([tok.encode("hi")], [SamplingParams(max_tokens=2)])
    assert o.policy_version == inner.policy_version == 0  # the HF engine stamps its own
    gw = Gateway(StampedEngine(inner), tok, GatewayConfig(embeddings=False, batch_wait_ms=5))
    with GatewayServer(gw) as srv:
        key = gw.register("t0", "b0")
        gw.set_chunk("t0", 0)
        c = openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0)
        c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    (seg,) = gw.store.get("t0")
    assert seg.policy_version == 6  # what sampled it, not what the engine says after the fact
