"""The PPO choices the report leaves open, as config values: clip sides logged
apart (golden values by hand), PPO epochs / mini-batches per rollout batch, and the loss's sequence
unit (segment or chunk)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hymem_train.segments import Segment
from hymem_train.trainer.config import LossConfig, TrainerConfig
from hymem_train.trainer.items import rl_items
from hymem_train.trainer.losses import ppo_clip_sides, ppo_token_loss
from hymem_train.trainer.packing import plan_updates, step_weights
from tests.trainer.helpers import make_items

torch.set_num_threads(1)


# --- clip sides: golden values ---------------------------------------------------------------------
# ratio r = exp(logp - old), old = 0; clip_low 0.2 (r >= 0.8), clip_high 0.28 (r <= 1.28)
_R = [1.5, 1.5, 0.5, 4.0, 0.5, 0.7, 1.25, 0.9]
_A = [1.0, -1.0, 1.0, -1.0, -1.0, -1.0, 1.0, -1.0]


def test_ppo_lower_clip_golden_with_negative_advantage():
    logp, old, adv = torch.log(torch.tensor(_R)), torch.zeros(len(_R)), torch.tensor(_A)
    loss, clipped = ppo_token_loss(logp, old, adv, clip_low=0.2, clip_high=0.28)
    want = [
        -1.28,  # r 1.5, A +1: upper clip, -(1.28 * 1)
        1.5,  # r 1.5, A -1: min(-1.5, -1.28) = -1.5, unclipped
        -0.5,  # r 0.5, A +1: min(0.5, 0.8) = 0.5, unclipped
        4.0,  # r 4, A -1: unclipped (no dual clip)
        0.8,  # r 0.5, A -1: LOWER clip, min(-0.5, -0.8) = -0.8 (without the lower clip: 0.5)
        0.8,  # r 0.7, A -1: LOWER clip (without it: 0.7)
        -1.25,  # r 1.25, A +1: inside 1 + 0.28 (clip_high, not clip_low, bounds this side)
        0.9,  # r 0.9, A -1: inside 1 - 0.2
    ]
    assert loss.tolist() == pytest.approx(want, abs=1e-6)
    low, high = ppo_clip_sides(logp, old, adv, clip_low=0.2, clip_high=0.28)
    assert low.tolist() == [False, False, False, False, True, True, False, False]
    assert high.tolist() == [True, False, False, False, False, False, False, False]
    assert (low | high).tolist() == clipped.tolist()
    assert not (low & high).any()


def test_clipfrac_sides_use_their_own_bound():
    # r = 0.75, A -1: clipped below with clip_low 0.2 (0.75 < 0.8), not with clip_low 0.3 (0.75 > 0.7)
    logp, old, adv = torch.tensor([math.log(0.75)]), torch.zeros(1), torch.tensor([-1.0])
    assert ppo_clip_sides(logp, old, adv, clip_low=0.2, clip_high=0.5)[0].item()
    assert not ppo_clip_sides(logp, old, adv, clip_low=0.3, clip_high=0.1)[0].item()


# --- sequence unit: segment vs chunk ---------------------------------------------------------------
def _seg(traj: str, chunk: int, call: int, R: int) -> Segment:
    return Segment(traj, chunk, call, [1, 2], list(range(3, 3 + R)), [-1.0] * R, "stop")


def test_chunk_unit_gives_a_multi_call_chunk_one_vote():
    # rollout a: chunk 0 made three calls (2, 3, 5 response tokens), chunk 1 one call (4 tokens)
    segs = [_seg("a", 0, 0, 2), _seg("a", 0, 1, 3), _seg("a", 0, 2, 5), _seg("a", 1, 0, 4)]
    adv = {("a", 0): 1.0, ("a", 1): -1.0}

    def chunk_mass(unit: str) -> list[float]:
        items = rl_items(segs, adv, sequence=unit)
        w = step_weights(items, "ppo")
        mass = [float(x.sum()) for x in w]
        return [sum(mass[:3]), mass[3]]

    # segment: 4 sequences of 1/4 each: the 3-call chunk carries 3/4 of the loss mass
    assert chunk_mass("segment") == pytest.approx([0.75, 0.25])
    # chunk: 2 sequences: one vote each, as A[i, t] has one vote; tokens of chunk 0 weigh 1/(10 * 2)
    assert chunk_mass("chunk") == pytest.approx([0.5, 0.5])
    w = step_weights(rl_items(segs, adv, sequence="chunk"), "ppo")
    assert w[0][0] == pytest.approx(1 / 20) and w[3][0] == pytest.approx(1 / 8)
    assert [it.sequence_id for it in rl_items(segs, adv, sequence="chunk")] == ["a/0", "a/0", "a/0", "a/1"]


def test_sequence_unit_and_update_counts_are_validated_by_name():
    with pytest.raises(ValueError, match="trainer.loss.sequence_unit"):
        LossConfig(kind="ppo", sequence_unit="trajectory").validate()
    with pytest.raises(ValueError, match="trainer.num_ppo_epochs"):
        TrainerConfig(lr=1.0, num_ppo_epochs=0, loss=LossConfig(kind="ppo")).validate()
    with pytest.raises(ValueError, match="need trainer.loss.kind='ppo'"):
        TrainerConfig(lr=1.0, num_mini_batches=2, loss=LossConfig(kind="opd")).validate()


# --- epochs and mini-batches -------------------------------------------------------------------------
def test_plan_updates_one_by_one_is_the_batch_itself():
    items = make_items(6, vocab=50)
    assert plan_updates(items, 1, 1) == [items]


def test_plan_updates_split_whole_sequences_and_cover_each_epoch():
    items = make_items(8, vocab=50)  # sequence_id t0..t3, two segments each
    ups = plan_updates(items, num_ppo_epochs=2, num_mini_batches=2, seed=3)
    assert len(ups) == 4
    for epoch in (ups[:2], ups[2:]):
        keys = sorted(it.key for u in epoch for it in u)
        assert keys == sorted(it.key for it in items)  # every item once per epoch
        for u in epoch:
            seqs = {it.sequence_id for it in u}
            assert len(seqs) == 2 and len(u) == 4  # whole sequences: both segments of each
    assert [[it.key for it in u] for u in ups] == [
        [it.key for it in u] for u in plan_updates(items, 2, 2, seed=3)
    ]  # the same plan on every rank
    with pytest.raises(ValueError, match="cannot fill trainer.num_mini_batches=5"):
        plan_updates(items, 1, 5)


@pytest.mark.slow
def test_second_update_sees_ratio_off_one_and_the_clip_engages(tiny_model):
    """`ratio_source: recompute` makes the first update's ratio exactly 1 (old policy = current
    weights); the second epoch, and the second mini-batch, are taken after an optimizer step, so
    their ratio is off 1 and the clip engages. lr 0.05 makes one step move the tiny model far."""
    from hymem_train.trainer.engine import Trainer

    cfg = TrainerConfig(
        lr=0.05,
        max_grad_norm=0.0,
        zero_stage=0,
        gradient_checkpointing=False,
        routing_replay=False,
        num_ppo_epochs=2,
        loss=LossConfig(kind="ppo", ratio_source="recompute", block_rows=16, block_vocab=256),
    )
    tr = Trainer(cfg, tiny_model)
    try:
        items = make_items(8, vocab=tiny_model.config.vocab_size, seed=7)
        m = tr.train_items(items, "ppo")
        first, second = tr.last_update_metrics
        assert m["train/num_updates"] == 2.0 and tr.step == 2
        assert first["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        assert first["train/clipfrac"] == 0.0
        assert abs(second["train/ratio_mean"] - 1.0) > 0.05
        assert second["train/clipfrac"] > 0.0
        for u in (first, second):
            assert u["train/clipfrac_low"] + u["train/clipfrac_high"] == pytest.approx(u["train/clipfrac"])
        assert m["train/clipfrac"] == pytest.approx((first["train/clipfrac"] + second["train/clipfrac"]) / 2)

        # one epoch, two mini-batches: the second mini-batch's old log-probs predate the first step
        tr.cfg.num_ppo_epochs, tr.cfg.num_mini_batches = 1, 2
        tr.train_items(make_items(8, vocab=tiny_model.config.vocab_size, seed=8), "ppo")
        mb1, mb2 = tr.last_update_metrics
        assert mb1["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5) and mb1["train/clipfrac"] == 0.0
        assert abs(mb2["train/ratio_mean"] - 1.0) > 0.05 and mb2["train/clipfrac"] > 0.0

        # 1 x 1 is one optimizer step, as before the knobs existed
        tr.cfg.num_mini_batches = 1
        before = tr.step
        one = tr.train_items(make_items(8, vocab=tiny_model.config.vocab_size, seed=9), "ppo")
        assert tr.step == before + 1 and "train/num_updates" not in one
        assert np.isfinite(one["train/loss"])
    finally:
        tr.close()
