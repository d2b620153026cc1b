"""Packing: block-causal isolation (packed == separate), route alignment, step weights, failures teacher-without-topk and chunk-unmapped."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hymem_train.models.presets import build_model, make_config
from hymem_train.models.routing import RoutingController
from hymem_train.trainer.config import LossConfig, PackingConfig
from hymem_train.trainer.losses import opd_token_loss, ppo_token_loss
from hymem_train.trainer.packing import block_causal_mask, padding_share, plan_step
from hymem_train.trainer.policy import PolicyLoss

from .helpers import make_items


def test_block_causal_mask_golden():
    m = block_causal_mask(torch.tensor([0, 0, 1, 1, 2]))[0, 0]
    allowed = (m == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1],
    ]


def test_layout_positions_targets_and_padding():
    items = make_items(3, vocab=50, lengths=[(4, 2), (3, 3), (2, 1)])
    [[mb]] = plan_step(items, PackingConfig(num_tokens_per_micro_batch=64, pad_to_multiple=8), "ppo")
    # FFD keeps items in index order inside a bin: lengths 6, 6, 3 -> 15 tokens, padded to 16
    assert mb.input_ids_1T.shape == (1, 16)
    assert mb.position_ids_1T[0].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 0]
    assert mb.segment_ids_T.tolist() == [0] * 6 + [1] * 6 + [2] * 3 + [3]
    # the hidden state at P-1+j predicts response token j
    assert mb.loss_pos_N.tolist() == [3, 4, 8, 9, 10, 13]
    want = items[0].segment.response_ids + items[1].segment.response_ids + items[2].segment.response_ids
    assert mb.target_ids_N.tolist() == want
    assert mb.input_ids_1T[0, mb.loss_pos_N + 1].tolist() == want
    assert padding_share([mb]) == pytest.approx(1 / 16)
    assert mb.cu_seqlens == (0, 6, 12, 15, 16)


@pytest.mark.parametrize(
    "attn,mode", [("eager", "block_causal"), ("sdpa", "block_causal"), ("sdpa", "segments")]
)
def test_packed_forward_equals_separate_forwards(attn, mode):
    torch.set_num_threads(1)
    model = build_model(make_config("tiny", attn_implementation=attn), seed=0).eval()
    reference = build_model(make_config("tiny", attn_implementation=attn), seed=0).eval()
    items = make_items(4, vocab=model.config.vocab_size, seed=1)
    [[mb]] = plan_step(items, PackingConfig(num_tokens_per_micro_batch=256, mask=mode), "ppo")
    assert mb.input_ids_1T.shape[1] > mb.num_real_tokens  # a padding tail is present
    pol = PolicyLoss(model, LossConfig(kind="ppo"), mask_mode=mode)
    with torch.no_grad():
        packed_TH = pol.hidden_states(mb)
        off = 0
        for it in items:
            ids = torch.tensor([it.segment.input_ids])
            sep = reference.model(input_ids=ids).last_hidden_state[0]
            torch.testing.assert_close(packed_TH[off : off + ids.shape[1]], sep, rtol=1e-5, atol=1e-5)
            off += ids.shape[1]
        # without isolation the segments do leak into each other (the test can fail)
        leak = reference.model(input_ids=mb.input_ids_1T, position_ids=mb.position_ids_1T).last_hidden_state[
            0
        ]
        n0, n1 = items[0].segment.num_tokens, items[1].segment.num_tokens
        assert not torch.allclose(leak[n0 : n0 + n1], packed_TH[n0 : n0 + n1], atol=1e-4)


def test_segment_attention_refuses_a_forward_without_boundaries():
    model = build_model(make_config("tiny"), seed=0)
    PolicyLoss(model, LossConfig(kind="sft"), mask_mode="segments")
    with pytest.raises(ValueError, match="hymem_cu_seqlens"):
        model.model(input_ids=torch.tensor([[1, 2, 3]]))


def test_routes_ride_along_and_replay_of_free_routes_is_exact(tiny_model):
    model = tiny_model.eval()
    ctl = RoutingController.attach(model)
    items = make_items(3, vocab=model.config.vocab_size, seed=2)
    with torch.no_grad():
        for it in items:  # what the engine would have recorded, one call per segment
            with ctl.capture() as rec:
                model.model(input_ids=torch.tensor([it.segment.input_ids]))
            it.segment.routed_experts_TLK = rec.routes_TLK
    [[mb]] = plan_step(items, PackingConfig(num_tokens_per_micro_batch=256), "ppo")
    assert mb.routes_1TLE is not None and mb.routes_1TLE.shape[:2] == mb.input_ids_1T.shape
    off = 0
    for it in items:  # position-by-position alignment
        n = it.segment.num_tokens
        assert np.array_equal(mb.routes_1TLE[0, off : off + n].numpy(), it.segment.routed_experts_TLK)
        off += n
    assert (mb.routes_1TLE[0, off:] == -1).all()
    pol = PolicyLoss(model, LossConfig(kind="ppo"))
    with torch.no_grad():
        free = pol.hidden_states(mb)
        with ctl.replay(mb.routes_1TLE):
            replayed = pol.hidden_states(mb)
        assert ctl.stats()["moe/replay_mismatch_rate"] == 0.0
        torch.testing.assert_close(replayed, free, rtol=1e-6, atol=1e-6)
        # forcing other experts changes the output and shows up in the mismatch metric
        other = torch.remainder(mb.routes_1TLE.long() + 1, model.config.num_experts).to(torch.int16)
        with ctl.replay(other):
            forced = pol.hidden_states(mb)
        assert ctl.stats()["moe/replay_mismatch_rate"] == 1.0
        assert not torch.allclose(forced, free, atol=1e-4)
    ctl.detach()


def test_step_weights_are_split_invariant():
    items = make_items(8, vocab=50, seed=3)
    whole = plan_step(items, PackingConfig(num_tokens_per_micro_batch=10_000), "ppo")
    split = plan_step(items, PackingConfig(num_tokens_per_micro_batch=20), "ppo", world_size=2)
    assert len(split[0]) == len(split[1]) >= 2

    def by_item(plan):
        out = {}
        for rank in plan:
            for mb in rank:
                off = 0
                for key in mb.item_keys:
                    it = next(i for i in items if i.key == key)
                    R = len(it.segment.response_ids)
                    out[key] = mb.weight_N[off : off + R].tolist()
                    off += R
        return out

    assert by_item(whole) == by_item(split)
    # sequence mean: each of the 4 sequences sums to 1/4
    w = by_item(whole)
    for s in range(4):
        assert sum(sum(v) for k, v in w.items() if k.startswith(f"t{s}/")) == pytest.approx(0.25)


def test_ranks_get_equal_micro_batch_counts_with_padding_rows():
    items = make_items(3, vocab=50, seed=4, lengths=[(5, 3), (5, 3), (5, 3)])
    plan = plan_step(items, PackingConfig(num_tokens_per_micro_batch=8), "ppo", world_size=2)
    assert [len(r) for r in plan] == [2, 2]
    empties = [mb for r in plan for mb in r if not mb.item_keys]
    assert len(empties) == 1 and empties[0].loss_pos_N.numel() == 0


def test_opd_without_teacher_topk_raises():
    items = make_items(2, vocab=50, kind="opd")
    items[1].teacher_topk_ids_RK = None
    with pytest.raises(
        ValueError, match=r"t0/1/0: teacher returned no top-k \(silent failure teacher-without-topk\)"
    ):
        plan_step(items, PackingConfig(), "opd")
    items = make_items(2, vocab=50, kind="opd")
    items[0].teacher_topk_ids_RK = items[0].teacher_topk_ids_RK[:-1]
    items[0].teacher_topk_logprobs_RK = items[0].teacher_topk_logprobs_RK[:-1]
    with pytest.raises(ValueError, match="do not cover"):
        plan_step(items, PackingConfig(), "opd")
    items = make_items(2, vocab=50, kind="opd")
    items[1].teacher_topk_logprobs_RK[0, 0] = -np.inf
    with pytest.raises(ValueError, match="t0/1/0: teacher top-k logprobs hold non-finite"):
        plan_step(items, PackingConfig(), "opd")


def test_segment_without_chunk_raises_and_oversize_names_segment():
    items = make_items(2, vocab=50)
    items[0].segment.chunk_index = -1
    with pytest.raises(ValueError, match="silent failure chunk-unmapped"):
        plan_step(items, PackingConfig(), "ppo")
    items = make_items(2, vocab=50, lengths=[(30, 5), (3, 2)])
    with pytest.raises(ValueError, match="t0/0/0: 35 tokens exceed"):
        plan_step(items, PackingConfig(num_tokens_per_micro_batch=16), "ppo")


@pytest.mark.parametrize("kind", ["opd", "ppo", "sft"])
def test_packed_policy_loss_equals_naive_full_vocab_per_segment(kind):
    """The whole training loss path (packing + segment attention + chunked head + weights) against a
    naive computation: one HF forward per segment, full [T, V] logits, plain formulas."""
    torch.set_num_threads(1)
    model = build_model(make_config("tiny"), seed=0)
    reference = build_model(make_config("tiny"), seed=0)
    items = make_items(5, vocab=model.config.vocab_size, seed=7, kind=kind, K=6)
    plan = plan_step(items, PackingConfig(num_tokens_per_micro_batch=40), kind, world_size=1)[0]
    assert len(plan) >= 2
    cfg = LossConfig(kind=kind, block_rows=5, block_vocab=100, opd_form="tail", dual_clip=2.0)
    pol = PolicyLoss(model, cfg)
    total = sum(pol(mb)[0] for mb in plan)
    total.backward()

    per_seq: dict[str, list[torch.Tensor]] = {}
    for it in items:
        s = it.segment
        P = len(s.prompt_ids)
        logits_TV = reference(input_ids=torch.tensor([s.input_ids])).logits[0]
        logp_RV = torch.log_softmax(logits_TV[P - 1 : -1], -1)
        tgt = torch.tensor(s.response_ids)
        if kind == "opd":
            ids = torch.as_tensor(it.teacher_topk_ids_RK)
            ent = -(logp_RV.exp() * logp_RV).sum(-1)
            lt = torch.as_tensor(it.teacher_topk_logprobs_RK, dtype=torch.float32)
            l_R = opd_token_loss(torch.zeros(len(tgt)), logp_RV.gather(1, ids), lt, ent, form="tail")
        elif kind == "ppo":
            lp = logp_RV.gather(1, tgt[:, None])[:, 0]
            l_R = ppo_token_loss(
                lp, torch.tensor(s.logprobs), torch.full_like(lp, it.advantage), dual_clip=2.0
            )[0]
        else:
            l_R = -logp_RV.gather(1, tgt[:, None])[:, 0]
        per_seq.setdefault(it.sequence_id if kind == "ppo" else "all", []).append(l_R)
    # report aggregation: PPO = token mean per sequence, then mean over sequences; OPD/SFT = token mean
    want = torch.stack([torch.cat(v).mean() for v in per_seq.values()]).mean()
    want.backward()
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-6)
    ref = dict(reference.named_parameters())
    for n, p in model.named_parameters():
        if ref[n].grad is None:
            assert p.grad is None or p.grad.abs().max() == 0, n
            continue
        torch.testing.assert_close(p.grad, ref[n].grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
