"""Golden values computed by hand, and chunked-vs-naive parity (values and gradients)."""

from __future__ import annotations

import math

import pytest
import torch

from hymem_train.trainer.chunked_head import chunked_head, naive_head
from hymem_train.trainer.config import LossConfig
from hymem_train.trainer.losses import (
    opd_support_stats,
    opd_token_loss,
    ppo_token_loss,
    sequence_mean_weights,
    sft_token_loss,
    token_mean_weight,
)

torch.set_num_threads(1)


# --- golden values -------------------------------------------------------------------------------
# student logits z = [0, 0, ln 2] -> p = [.25, .25, .5], lse = ln 4, H = 1.5 ln 2
# teacher top-2 = ids [2, 0] with p_t = [.6, .3]
_LSE = torch.tensor([math.log(4.0)])
_ZK = torch.tensor([[math.log(2.0), 0.0]])
_LT = torch.tensor([[math.log(0.6), math.log(0.3)]])
_H = torch.tensor([1.5 * math.log(2.0)])


def test_opd_report_form_golden():
    got = opd_token_loss(_LSE, _ZK, _LT, _H, form="report", entropy_coef=0.0)
    want = 0.5 * math.log(0.5 / 0.6) + 0.25 * math.log(0.25 / 0.3)  # = -0.13674, truncated KL can be < 0
    assert got.item() == pytest.approx(want, abs=1e-6)


def test_opd_tail_form_golden_and_entropy_bonus():
    got = opd_token_loss(_LSE, _ZK, _LT, _H, form="tail", entropy_coef=0.005)
    tail = 0.25 * math.log(0.25 / 0.1)  # student tail 1 - .75, teacher tail 1 - .9
    want = 0.5 * math.log(0.5 / 0.6) + 0.25 * math.log(0.25 / 0.3) + tail - 0.005 * 1.5 * math.log(2.0)
    assert got.item() == pytest.approx(want, abs=1e-6)


def test_opd_tail_form_blocks_the_mass_shrinking_pitfall():
    # A student that puts (almost) no mass on the teacher's support: the report form gives ~0
    # (it looks perfect), the tail form gives a large KL.
    lse = torch.tensor([0.0])
    zk = torch.tensor([[-30.0, -30.0]])
    report = opd_token_loss(lse, zk, _LT, torch.zeros(1), form="report", entropy_coef=0.0)
    tail = opd_token_loss(lse, zk, _LT, torch.zeros(1), form="tail", entropy_coef=0.0)
    assert abs(report.item()) < 1e-10
    assert tail.item() == pytest.approx(math.log(1.0 / 0.1), abs=1e-4)


def test_opd_support_stats_golden():
    st = opd_support_stats(_LSE, _ZK, torch.tensor([[2, 0]]), _LT, torch.tensor([1]))
    assert st["student_mass_sum"].item() == pytest.approx(0.75)
    assert st["teacher_mass_sum"].item() == pytest.approx(0.9)
    assert st["coverage_sum"].item() == 0.0  # sampled token 1 not in teacher top-2
    st = opd_support_stats(_LSE, _ZK, torch.tensor([[2, 0]]), _LT, torch.tensor([0]))
    assert st["coverage_sum"].item() == 1.0


def test_ppo_golden():
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 4.0]))
    old = torch.zeros(4)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, clipped = ppo_token_loss(logp, old, adv, clip_low=0.2, clip_high=0.2)
    assert loss.tolist() == pytest.approx([-1.2, 1.5, -0.5, 4.0], abs=1e-6)
    assert clipped.tolist() == [True, False, False, False]
    loss, _ = ppo_token_loss(logp, old, adv, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    assert loss.tolist() == pytest.approx([-1.2, 1.5, -0.5, 3.0], abs=1e-6)  # 4.0 capped at c*|A|


def test_sft_and_weights_golden():
    assert sft_token_loss(_LSE, torch.tensor([0.0])).item() == pytest.approx(math.log(4.0))
    w = sequence_mean_weights(torch.tensor([2, 4]))
    assert w.tolist() == pytest.approx([1 / 4, 1 / 8])
    # loss 1 on every token of both sequences -> double mean 1
    assert (w[0] * 2 + w[1] * 4).item() == pytest.approx(1.0)
    assert token_mean_weight(8) == 0.125
    with pytest.raises(ValueError):
        sequence_mean_weights(torch.tensor([3, 0]))


def test_loss_config_validation_names_key():
    with pytest.raises(ValueError, match="trainer.loss.opd_form"):
        LossConfig(opd_form="trunc").validate()
    with pytest.raises(ValueError, match="trainer.loss.dual_clip"):
        LossConfig(dual_clip=0.5).validate()


# --- chunked head parity --------------------------------------------------------------------------


def _inputs(N=37, H=16, V=300, K=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=g, dtype=dtype)
    w = torch.randn(V, H, generator=g, dtype=dtype) * 0.5
    ids = torch.randint(0, V, (N, K), generator=g)
    return h, w, ids


@pytest.mark.parametrize("blocks", [(1, 300), (8, 7), (37, 64), (64, 1000), (5, 1)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_head_matches_naive_values_and_grads(blocks, temperature):
    h, w, ids = _inputs()
    g = torch.Generator().manual_seed(1)
    c_lse, c_g, c_ent = (
        torch.randn(37, generator=g),
        torch.randn(37, 5, generator=g),
        torch.randn(37, generator=g),
    )

    def run(fn, **kw):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        lse, gat, ent = fn(hh, ww, ids, temperature=temperature, **kw)
        # a random linear functional of all three outputs exercises every backward term
        ((lse * c_lse).sum() + (gat * c_g).sum() + (ent * c_ent).sum()).backward()
        return lse, gat, ent, hh.grad, ww.grad

    ours = run(chunked_head, block_rows=blocks[0], block_vocab=blocks[1])
    ref = run(naive_head)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=2e-5)  # fp32 inside


@pytest.mark.parametrize("form", ["report", "tail"])
def test_opd_loss_through_chunked_head_matches_full_vocab(form):
    h, w, _ = _inputs(N=20, V=200, K=50, dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    t_logits = torch.randn(20, 200, generator=g) * 2
    t_lp, t_ids = torch.log_softmax(t_logits, -1).topk(50, dim=-1)

    def ours():
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        lse, zk, ent = chunked_head(hh, ww, t_ids, block_rows=6, block_vocab=33)
        loss = opd_token_loss(lse, zk, t_lp, ent, form=form).mean()
        loss.backward()
        return loss, hh.grad, ww.grad

    def full_vocab():
        # independent reference: the loss written directly on the full [N, V] log-softmax
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        logp_NV = torch.log_softmax(hh @ ww.T, -1)
        p_NV = logp_NV.exp()
        ls = logp_NV.gather(1, t_ids)
        kl = (ls.exp() * (ls - t_lp)).sum(-1)
        if form == "tail":
            qs, qt = 1 - ls.exp().sum(-1), 1 - t_lp.exp().sum(-1)
            kl = kl + qs * (qs.log() - qt.log())
        ent = -(p_NV * logp_NV).sum(-1)
        loss = (kl - 0.005 * ent).mean()
        loss.backward()
        return loss, hh.grad, ww.grad

    for a, b in zip(ours(), full_vocab(), strict=True):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)


def test_ppo_loss_through_chunked_head_matches_full_vocab():
    h, w, ids = _inputs(N=30, V=250, K=1, dtype=torch.float32)
    tgt = ids[:, 0]
    old = torch.randn(30) * 0.1 - 5.0
    adv = torch.randn(30)

    def ours():
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        lse, zt, _ = chunked_head(hh, ww, tgt[:, None], block_rows=7, block_vocab=40, with_entropy=False)
        loss = ppo_token_loss(zt[:, 0] - lse, old, adv, dual_clip=3.0)[0].mean()
        loss.backward()
        return loss, hh.grad, ww.grad

    def full_vocab():
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        logp = torch.log_softmax(hh @ ww.T, -1).gather(1, tgt[:, None])[:, 0]
        loss = ppo_token_loss(logp, old, adv, dual_clip=3.0)[0].mean()
        loss.backward()
        return loss, hh.grad, ww.grad

    for a, b in zip(ours(), full_vocab(), strict=True):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)


def test_chunked_head_rejects_bad_shapes():
    h, w, ids = _inputs()
    with pytest.raises(ValueError, match="ids"):
        chunked_head(h, w, ids[:3])
    with pytest.raises(ValueError, match="block_rows"):
        chunked_head(h, w, ids, block_rows=0)


def test_chunked_head_bf16_stays_close_to_fp32_reference():
    # bf16 model (GPU path): logits from a bf16 matmul, softmax math and gradient sums in fp32
    h, w, ids = _inputs(N=40, H=32, V=3000, K=3, dtype=torch.float32)
    hb, wb = h.bfloat16().requires_grad_(), w.bfloat16().requires_grad_()
    lse, gat, ent = chunked_head(hb, wb, ids, block_rows=16, block_vocab=128)
    (lse.sum() - gat.sum() + ent.sum()).backward()
    hr, wr = hb.detach().float().requires_grad_(), wb.detach().float().requires_grad_()
    r_lse, r_gat, r_ent = naive_head(hr, wr, ids)
    (r_lse.sum() - r_gat.sum() + r_ent.sum()).backward()
    assert hb.grad.dtype == torch.bfloat16 and wb.grad.dtype == torch.bfloat16
    torch.testing.assert_close(lse, r_lse, rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(ent, r_ent, rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(hb.grad.float(), hr.grad, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(wb.grad.float(), wr.grad, rtol=5e-2, atol=5e-2)
