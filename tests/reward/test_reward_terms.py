"""Golden values for prm / orm / growth penalty, computed by hand from the formulas in docs/reward.md."""

import math

import pytest

from harnesses.base import MemoryEntry as E
from reward.counterfactual import ADDED, chunk_writes, left_out
from reward.terms import (
    FAULT,
    binarize,
    growth_penalty,
    growth_ratio,
    orm_attributed,
    orm_broadcast,
    orm_counterfactual,
    prm,
)

# --- prm[t] = (sum_R z + sum_P z) / (|R| + |P|)


def test_prm_mean_of_recall_and_traps():
    # (1.0 + 0.5 + 0.0) / 3
    assert prm([1.0, 0.5], [0.0]) == (pytest.approx(0.5), True)


def test_prm_without_traps_ablation():
    # traps dropped from numerator and denominator: (1.0 + 0.5) / 2
    assert prm([1.0, 0.5], [0.0], use_traps=False) == (pytest.approx(0.75), True)


def test_prm_chunk_with_no_probe_scores_zero_and_is_valid():
    assert prm([], []) == (0.0, True)
    # traps only, traps switched off: no probe left
    assert prm([], [1.0], use_traps=False) == (0.0, True)


def test_prm_faulted_probe_leaves_the_denominator():
    # the faulted probe is neither a 0 nor counted: (1.0 + 0.5) / 2, not (1.0 + 0 + 0.5) / 3
    assert prm([1.0, FAULT], [0.5]) == (pytest.approx(0.75), True)


def test_prm_all_probes_faulted_is_invalid_not_zero():
    v, ok = prm([FAULT], [FAULT])
    assert not ok


def test_binarize_rubric_scores():
    assert [binarize(z, 0.5) for z in (0.8, 0.5, 0.49, 0.0)] == [1.0, 1.0, 0.0, 0.0]
    assert math.isnan(binarize(FAULT, 0.5))
    # binary ablation on prm: recall 0.8 -> 1, 0.4 -> 0, trap 0.5 -> 1: 2/3
    z = [binarize(x, 0.5) for x in (0.8, 0.4)]
    assert prm(z, [binarize(0.5, 0.5)])[0] == pytest.approx(2 / 3)


# --- orm: the 3-chunk example worked by hand
# Q1 facts: chunk0, chunk1            recovered: yes, no
# Q2 facts: chunk1, chunk1, chunk2    recovered: yes, no, yes
# Q3 facts: earlier window, chunk2    recovered: no,  no
SRC = [[0, 1], [1, 1, 2], [None, 2]]
REC = [[True, False], [True, False, True], [False, False]]


def test_orm_attributed_three_chunks_by_hand():
    # t=0: Q_0={Q1}: c=1/1                      -> 1.0
    # t=1: Q_1={Q1,Q2}: Q1 0/1, Q2 1/2          -> (0 + 0.5) / 2 = 0.25
    # t=2: Q_2={Q2,Q3}: Q2 1/1, Q3 0/1          -> (1 + 0) / 2 = 0.5
    orm_C, ok_C = orm_attributed(REC, SRC, 3)
    assert orm_C == pytest.approx([1.0, 0.25, 0.5])
    assert ok_C == [True, True, True]


def test_orm_broadcast_three_chunks_by_hand():
    # shares over all facts: Q1 1/2, Q2 2/3, Q3 0/2 -> mean 7/18 on every chunk
    orm_C, ok_C = orm_broadcast(REC, 3)
    assert orm_C == pytest.approx([7 / 18] * 3)
    assert ok_C == [True] * 3


def test_orm_attributed_chunk_without_questions_scores_zero():
    orm_C, ok_C = orm_attributed([[True]], [[0]], 3)
    assert orm_C == [1.0, 0.0, 0.0]
    assert ok_C == [True, True, True]


def test_orm_faulted_question_excluded():
    # Q2 faulted: t=1 only Q1 (0/1) -> 0.0 ; t=2 only Q3 (0/1) -> 0.0 ; t=0 unchanged
    orm_C, ok_C = orm_attributed([REC[0], None, REC[2]], SRC, 3)
    assert orm_C == pytest.approx([1.0, 0.0, 0.0])
    assert ok_C == [True, True, True]
    # every question of chunk 1 faulted -> chunk 1 invalid, not 0
    orm_C, ok_C = orm_attributed([None, None, REC[2]], SRC, 3)
    assert ok_C == [False, False, True]
    b, bok = orm_broadcast([None, None, None], 3)
    assert bok == [False] * 3


def test_orm_binary_ablation():
    # c_q[t] thresholded at 0.5: t=1: Q1 0 -> 0, Q2 0.5 -> 1 => 0.5
    orm_C, _ = orm_attributed(REC, SRC, 3, binary_threshold=0.5)
    assert orm_C == pytest.approx([1.0, 0.5, 0.5])
    # broadcast: Q1 0.5->1, Q2 0.667->1, Q3 0->0 => 2/3
    assert orm_broadcast(REC, 3, binary_threshold=0.5)[0] == pytest.approx([2 / 3] * 3)


def test_orm_rejects_fact_outside_window():
    with pytest.raises(ValueError, match="window position 3"):
        orm_attributed([[True]], [[3]], 3)
    with pytest.raises(ValueError, match="question 0 has 2 gold facts but 1 verdicts"):
        orm_attributed([[True]], [[0, 1]], 3)


# --- growth penalty


def test_growth_ratio_by_hand():
    assert growth_ratio(4096, 6144, 2048) == 1.5
    # empty parent bank: the floor stands in for B_{t-1}
    assert growth_ratio(0, 1024, 2048) == 0.5
    with pytest.raises(ValueError):
        growth_ratio(-1, 10, 2048)


def test_growth_penalty_by_hand():
    # x = (1.5 - 1) / (2 - 1) = 0.5 ; (e^1.5 - 1) / (e^3 - 1) = 3.4816890703 / 19.0855369232
    assert growth_penalty(1.5, 1.0, 2.0) == pytest.approx(3.4816890703 / 19.0855369232)
    assert growth_penalty(0.7, 1.0, 2.0) == 0.0  # clipped below
    assert growth_penalty(1.0, 1.0, 2.0) == 0.0
    assert growth_penalty(2.0, 1.0, 2.0) == pytest.approx(1.0)
    assert growth_penalty(9.0, 1.0, 2.0) == pytest.approx(1.0)  # clipped above
    # other bounds: x = (1.3 - 1.1) / (1.5 - 1.1) = 0.5 again
    assert growth_penalty(1.3, 1.1, 1.5) == pytest.approx(0.18242552380635635)
    with pytest.raises(ValueError, match="upper > lower"):
        growth_penalty(1.0, 2.0, 2.0)


def test_orm_counterfactual_by_hand():
    full = [[True, True], [True, False]]  # q0: 2/2 recovered, q1: 1/2
    without = [
        [[False, True], [True, False]],  # chunk 0 left out: q0 drops to 1/2, q1 unchanged
        [[True, True], [True, True]],  # chunk 1 left out: q1 rises to 2/2 (its write cost an answer)
        [None, [False, False]],  # chunk 2: q0 faulted (left out), q1 drops to 0
    ]
    orm_C, ok_C = orm_counterfactual(full, without, 3)
    assert orm_C == pytest.approx([0.25, -0.25, 0.5]) and ok_C == [True, True, True]
    orm_C, ok_C = orm_counterfactual(full, [[None, None]], 1)
    assert orm_C == [0.0] and ok_C == [False]  # every question faulted: no information, invalid
    assert orm_counterfactual([], [[]], 1) == ([0.0], [True])  # no questions: 0, valid
    orm_C, _ = orm_counterfactual(full, without[:1], 1, binary_threshold=0.75)
    assert orm_C == [0.5]  # binary: q0 1 -> 0, q1 0 -> 0
    with pytest.raises(ValueError, match="2 leave-out readings for 3 chunks"):
        orm_counterfactual(full, without[:2], 3)


def test_leave_out_drops_added_reverts_updated_keeps_superseded():
    before = [E("1", "job: baker"), E("2", "city: Oslo")]
    after = [E("1", "job: chef"), E("2", "city: Oslo"), E("3", "dog: Rex")]
    writes = chunk_writes(before, after)
    assert writes == {"1": "job: baker", "3": ADDED}
    after_text = {e.id: e.text for e in after}
    final = [E("3", "dog: Rex"), E("1", "job: chef"), E("2", "city: Oslo")]
    view = left_out(final, writes, after_text, k=2)
    assert [(e.id, e.text) for e in view] == [("1", "job: baker"), ("2", "city: Oslo")]
    # a later chunk changed record 1 again: chunk t's update no longer stands, nothing to undo
    final = [E("1", "job: pilot"), E("2", "city: Oslo")]
    assert [e.text for e in left_out(final, writes, after_text, k=2)] == ["job: pilot", "city: Oslo"]
