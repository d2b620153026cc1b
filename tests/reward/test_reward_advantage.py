"""Golden values for s[t] and the chunk- / window-level GRPO advantages."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hymem_train.segments import Segment
from hymem_train.trainer.items import rl_items
from reward.advantage import (
    chunk_score_valid,
    chunk_scores,
    grpo_advantages,
    grpo_chunk_advantages,
    grpo_window_advantages,
)

PRM = [0.5, 1.0, 0.0]


def _seg(traj: str, chunk: int, call: int) -> Segment:
    return Segment(traj, chunk, call, [1, 2], [3], [-1.0], "stop")


ORM = [1.0, 0.25, 0.5]
PEN = [0.0, 0.5, 1.0]


def test_s_default_weights_gamma_zero():
    # s = 1*prm + 2*orm - 0.3*pen: [0.5+2-0, 1+0.5-0.15, 0+1-0.3]
    assert chunk_scores(PRM, ORM, PEN) == pytest.approx([2.5, 1.35, 0.7])


def test_s_gamma_half_discounts_future_prm():
    # t0: 0.5 + 0.5*1.0 + 0.25*0.0 = 1.0 ; t1: 1.0 + 0.5*0.0 = 1.0 ; t2: 0.0
    assert chunk_scores(PRM, ORM, PEN, gamma=0.5) == pytest.approx([3.0, 1.35, 0.7])


def test_s_gamma_zero_ignores_a_faulted_future_chunk():
    s = chunk_scores([0.5, math.nan], [0.0, 0.0], [0.0, 0.0])
    assert s[0] == 0.5
    assert chunk_score_valid([True, False], [True, True], [True, True], gamma=0.0) == [True, False]
    # with gamma > 0, chunk 0 reads prm[1] and becomes invalid too
    assert chunk_score_valid([True, False], [True, True], [True, True], gamma=0.5) == [False, False]
    assert chunk_score_valid([True, True], [True, False], [True, True], gamma=0.0) == [True, False]


def test_chunk_advantage_per_column_by_hand():
    # column 0: [1, 2, 3] -> mean 2, unbiased std 1 -> [-1, 0, 1]
    # column 1: [5, 5, 5] -> std 0 -> all 0
    s = [[1.0, 5.0], [2.0, 5.0], [3.0, 5.0]]
    v = [[True, True]] * 3
    adv = grpo_chunk_advantages(s, v, eps=1e-6)
    assert [a[0] for a in adv] == pytest.approx([-1.0, 0.0, 1.0], abs=1e-5)
    assert [a[1] for a in adv] == [0.0, 0.0, 0.0]


def test_invalid_rollout_excluded_from_mean_and_std():
    # rollout 3 is a platform failure with a wild score: it must not move the others
    s = [[1.0], [2.0], [3.0], [100.0]]
    v = [[True], [True], [True], [False]]
    adv = grpo_chunk_advantages(s, v)
    assert [a[0] for a in adv] == pytest.approx([-1.0, 0.0, 1.0, 0.0], abs=1e-5)


def test_group_with_one_valid_rollout_gets_zero():
    s = [[1.0, 1.0], [7.0, 2.0], [9.0, 3.0]]
    v = [[True, True], [False, True], [False, True]]
    try:
        adv = grpo_chunk_advantages(s, v)
    except ArithmeticError as e:  # the guard's number is the contract, not whichever error its absence gives
        pytest.fail(f"a column with fewer than 2 valid rollouts must get advantage 0, got {e!r}")
    assert [a[0] for a in adv] == [0.0, 0.0, 0.0]  # one valid vote in column 0
    assert [a[1] for a in adv] == pytest.approx([-1.0, 0.0, 1.0], abs=1e-5)
    # window level: only rollout 0 is fully valid -> every advantage 0
    assert grpo_window_advantages(s, v) == [[0.0, 0.0]] * 3


def test_window_level_advantage_by_hand():
    # sums [1, 2, 4]: mean 7/3, var = (16/9 + 1/9 + 25/9) / 2 = 7/3
    s = [[1.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    v = [[True, True]] * 3
    sd = math.sqrt(7 / 3)
    want = [(1 - 7 / 3) / sd, (2 - 7 / 3) / sd, (4 - 7 / 3) / sd]
    adv = grpo_advantages(s, v, level="window")
    for i in range(3):
        assert adv[i] == pytest.approx([want[i]] * 2, abs=1e-5)
    assert want[0] == pytest.approx(-0.8728715609, abs=1e-9)
    with pytest.raises(ValueError, match="advantage level"):
        grpo_advantages(s, v, level="token")


def test_three_llm_calls_in_a_chunk_count_once():
    # chunk 1 scores [3, 1, 2]: one vote each -> mean 2, std 1 -> A = [1, -1, 0].
    # Rollout 0's chunk 1 made 3 calls. A per-call normalisation would see [3,3,3,1,2] (mean 2.4,
    # std sqrt(0.8)) and give rollout 0 only 0.6708: the test would catch that.
    s = [[0.0, 3.0], [0.0, 1.0], [0.0, 2.0]]
    v = [[True, True]] * 3
    adv = grpo_chunk_advantages(s, v)
    # the production join (trainer/items.py): each LLM call gets its own chunk's A[i, t]
    calls = {"a": [0, 1, 1, 1], "b": [0, 1], "c": [0, 1]}
    items = rl_items(
        [_seg(traj, c, k) for traj, cs in calls.items() for k, c in enumerate(cs)],
        {(traj, c): adv[i][c] for i, traj in enumerate(calls) for c in (0, 1)},
    )
    it = iter(x.advantage for x in items)
    seg = [[next(it) for _ in cs] for cs in calls.values()]
    assert seg[0][1:] == pytest.approx([1.0, 1.0, 1.0], abs=1e-5)
    assert seg[1][1] == pytest.approx(-1.0, abs=1e-5)
    assert seg[2][1] == pytest.approx(0.0, abs=1e-6)
    naive = (3 - 2.4) / math.sqrt(0.8)
    assert abs(seg[0][1] - naive) > 0.3


# --- properties (hypothesis): hold for any group, not just the hand-worked ones

_cell = st.tuples(st.floats(-10, 10, allow_nan=False), st.booleans())
_groups = st.integers(1, 4).flatmap(
    lambda C: st.lists(st.lists(_cell, min_size=C, max_size=C), min_size=1, max_size=8)
)


@settings(max_examples=60, deadline=None)
@given(_groups)
def test_chunk_advantages_centre_each_column_and_ignore_invalid_cells(cells):
    s = [[c[0] for c in row] for row in cells]
    v = [[c[1] for c in row] for row in cells]
    adv = grpo_chunk_advantages(s, v)
    for t in range(len(s[0])):
        rows = [i for i in range(len(s)) if v[i][t]]
        assert all(adv[i][t] == 0.0 for i in range(len(s)) if not v[i][t])
        if len(rows) >= 2:
            assert abs(sum(adv[i][t] for i in rows)) < 1e-6
    # a wild invalid rollout added to the group moves nothing
    wild = grpo_chunk_advantages([*s, [1e9] * len(s[0])], [*v, [False] * len(s[0])])
    assert wild[:-1] == adv and wild[-1] == [0.0] * len(s[0])
