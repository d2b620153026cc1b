"""Segments -> TrainItems: teacher top-k alignment (silent failure teacher-without-topk) and advantage mapping (silent failure chunk-unmapped)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hymem_train.engines.base import TopKLogprobs
from hymem_train.segments import Segment
from hymem_train.trainer.items import opd_items, rl_items


def _seg(traj="t", chunk=0, call=0, P=3, R=2):
    return Segment(traj, chunk, call, list(range(1, P + 1)), list(range(10, 10 + R)), [-1.0] * R, "stop")


def test_opd_items_align_teacher_rows_with_response_tokens():
    s = _seg(P=3, R=2)  # sequence [1, 2, 3, 10, 11]: rows 2 and 3 predict 10 and 11
    ids = torch.arange(5 * 2).reshape(5, 2)
    lps = -torch.arange(5 * 2, dtype=torch.float32).reshape(5, 2)
    [it] = opd_items([s], [TopKLogprobs(ids_TK=ids, logprobs_TK=lps)])
    assert it.teacher_topk_ids_RK.tolist() == [[4, 5], [6, 7]]
    assert it.teacher_topk_logprobs_RK.tolist() == [[-4.0, -5.0], [-6.0, -7.0]]
    # the engine may score the last token too (T = P + R); only P + R - 1 rows are needed
    [it] = opd_items([s], [TopKLogprobs(ids_TK=ids[:4], logprobs_TK=lps[:4])])
    assert it.teacher_topk_ids_RK.shape == (2, 2)


def test_opd_items_raise_on_missing_or_short_teacher_answer():
    s = _seg(P=3, R=2)
    # the guard's own error for every shape of "no answer", not whatever crash the code hits without it
    empty = torch.zeros(0, 2, dtype=torch.long)
    for answer in (None, TopKLogprobs(ids_TK=None, logprobs_TK=None), TopKLogprobs(empty, empty.float())):
        with pytest.raises(Exception) as err:
            opd_items([s], [answer])
        assert (
            err.type is ValueError
            and "t/0/0: teacher returned no top-k (silent failure teacher-without-topk)" in str(err.value)
        ), f"{answer!r}: {err.type.__name__}: {err.value}"
    with pytest.raises(ValueError, match="covers 3 positions, need 4"):
        opd_items(
            [s], [TopKLogprobs(ids_TK=torch.zeros(3, 2, dtype=torch.long), logprobs_TK=torch.zeros(3, 2))]
        )
    with pytest.raises(ValueError, match="1 teacher answers for 2 segments"):
        opd_items([s, s], [None])


def test_rl_items_map_advantages_per_chunk_and_raise_on_missing():
    segs = [_seg("a", 0, 0), _seg("a", 0, 1), _seg("a", 1, 0), _seg("b", 0, 0)]
    adv = {("a", 0): 0.5, ("a", 1): -1.0, ("b", 0): 2.0}
    items = rl_items(segs, adv)
    assert [it.advantage for it in items] == [0.5, 0.5, -1.0, 2.0]
    assert [it.sequence_id for it in items] == ["", "", "", ""]
    assert [it.sequence_id for it in rl_items(segs, adv, sequence="trajectory")] == ["a", "a", "a", "b"]
    with pytest.raises(
        ValueError,
        match=r"b/0/0: no advantage for trajectory/chunk \('b', 0\) \(silent failure chunk-unmapped\)",
    ):
        rl_items(segs, {("a", 0): 0.5, ("a", 1): -1.0})
    with pytest.raises(ValueError, match="silent failure chunk-unmapped"):
        rl_items([_seg("a", -1)], {("a", -1): 1.0})
    assert np.isfinite([it.advantage for it in items]).all()
