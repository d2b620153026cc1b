"""score_group golden values: the report recipe and each ablation switch on one hand-worked group.

Group: 2 chunks, 3 rollouts, bounds l=1, u=2, floor 2048 tokens, one ORM question whose gold facts
come from chunk 0 and chunk 1.
  r0: recall z [[1.0], [0.5]], trap z [[0.0], []], recovered [T, T], sizes 0 -> 1024 -> 3072
  r1: recall z [[0.0], [0.5, FAULT]], trap z [[1.0], []], recovered [F, T], sizes 0 -> 1024 -> 1024
  r2: platform_error (excluded whole)
By hand: prm r0 = [(1+0)/2, 0.5] = [0.5, 0.5]; r1 = [(0+1)/2, 0.5 (fault left out)] = [0.5, 0.5]
  orm (attributed) r0 = [1, 1]; r1 = [0, 1]
  g r0 = [1024/2048, 3072/2048] = [0.5, 1.5] -> pen [0, P] with P = (e^1.5-1)/(e^3-1); r1 g = [0.5, 0.5] -> [0, 0]
  s r0 = [0.5 + 2, 0.5 + 2 - 0.3 P]; r1 = [0.5, 2.5]
"""

import math

import pytest

from reward.scoring import (
    M_EXCL_CELLS,
    M_EXCL_PROBES,
    M_EXCL_QUESTIONS,
    M_EXCL_ROLLOUTS,
    M_TRAP_PASS,
    M_ZERO_ADV,
    GrowthBounds,
    JudgedRollout,
    ScoringConfig,
    score_group,
)
from reward.terms import FAULT

P = (math.exp(1.5) - 1) / (math.exp(3) - 1)
R = 1 / math.sqrt(2)  # two valid votes a != b always normalise to -+1/sqrt(2) (unbiased std)
SRC = [[0, 1]]


def group():
    return [
        JudgedRollout("ok", [[1.0], [0.5]], [[0.0], []], [[True, True]], 0, [1024, 3072]),
        JudgedRollout("ok", [[0.0], [0.5, FAULT]], [[1.0], []], [[False, True]], 0, [1024, 1024]),
        JudgedRollout("platform_error", [[], []], [[], []], [None], None, [None, None]),
    ]


def cfg(**kw):
    return ScoringConfig(growth_bounds={"native": GrowthBounds(1.0, 2.0, 2048)}, **kw)


def col(t2d, t):
    return [row[t] for row in t2d]


def test_report_recipe():
    g = score_group(group(), SRC, cfg(), "native")
    assert g.prm_GC[:2] == [[0.5, 0.5], [0.5, 0.5]]
    assert g.orm_GC[:2] == [[1.0, 1.0], [0.0, 1.0]]
    assert g.pen_GC[0] == pytest.approx([0.0, P]) and g.pen_GC[1] == [0.0, 0.0]
    assert g.s_GC[0] == pytest.approx([2.5, 2.5 - 0.3 * P]) and g.s_GC[1] == pytest.approx([0.5, 2.5])
    assert g.valid_GC == [[True, True], [True, True], [False, False]]
    # column 0: r0 2.5 > r1 0.5 ; column 1: r0 2.5-0.3P < r1 2.5 ; r2 excluded -> 0
    assert col(g.adv_GC, 0) == pytest.approx([R, -R, 0.0], abs=1e-5)
    # the gap is only 0.3P here, so eps shows: A = (d/2) / (d/sqrt(2) + eps), d = 0.3P
    d = 0.3 * P
    a1 = (d / 2) / (d / math.sqrt(2) + 1e-6)
    assert col(g.adv_GC, 1) == pytest.approx([-a1, a1, 0.0], rel=1e-9)
    m = g.metrics
    assert m[M_TRAP_PASS] == 0.5
    assert m[M_EXCL_PROBES] == pytest.approx(1 / 7)  # r0: 3 probes, r1: 4 probes, 1 fault
    assert m[M_EXCL_QUESTIONS] == 0.0
    assert m[M_EXCL_ROLLOUTS] == pytest.approx(1 / 3)
    assert m[M_EXCL_CELLS] == pytest.approx(2 / 6)
    assert m[M_ZERO_ADV] == 0.0  # every valid cell's column had distinct votes
    assert m["reward/prm"] == 0.5 and m["reward/orm"] == 0.75
    assert m["reward/pen"] == pytest.approx(P / 4)


def test_probes_without_traps():
    # prm[0]: r0 = 1 (recall only), r1 = 0 -> s0 = [3, 0]
    g = score_group(group(), SRC, cfg(use_traps=False), "native")
    assert col(g.prm_GC, 0)[:2] == [1.0, 0.0]
    assert col(g.s_GC, 0)[:2] == pytest.approx([3.0, 0.0])
    assert math.isnan(g.metrics[M_TRAP_PASS])
    assert g.metrics[M_EXCL_PROBES] == pytest.approx(1 / 5)  # traps not counted: 2 + 3 probes


def test_no_growth_penalty():
    # s1 = [2.5, 2.5]: equal votes -> advantage 0
    g = score_group(group(), SRC, cfg(use_growth_penalty=False), "unknown-harness-needs-no-bounds")
    assert g.pen_GC == [[0.0, 0.0]] * 3
    assert col(g.s_GC, 1)[:2] == [2.5, 2.5]
    assert col(g.adv_GC, 1) == [0.0, 0.0, 0.0]
    assert g.metrics[M_ZERO_ADV] == 0.5  # 2 of the 4 valid cells (column 1) carry no signal


def test_binary_scores():
    # recall 0.5 -> 1: prm r0 = [0.5, 1], r1 = [0.5, 1]; s1 r0 = 1 + 2 - 0.3P, r1 = 3
    g = score_group(group(), SRC, cfg(score_mode="binary"), "native")
    assert g.prm_GC[:2] == [[0.5, 1.0], [0.5, 1.0]]
    assert col(g.s_GC, 1)[:2] == pytest.approx([3 - 0.3 * P, 3.0])


def test_broadcast_orm():
    # r1 recovered 1 of 2 facts: 0.5 on both chunks; s r1 = [0.5 + 1, 0.5 + 1]
    g = score_group(group(), SRC, cfg(orm_mode="broadcast"), "native")
    assert g.orm_GC[:2] == [[1.0, 1.0], [0.5, 0.5]]
    assert g.s_GC[1] == pytest.approx([1.5, 1.5])


def test_window_level_advantage():
    # sums r0 = 5 - 0.3P, r1 = 3: two votes -> +-1/sqrt(2) on every chunk
    g = score_group(group(), SRC, cfg(advantage_level="window"), "native")
    assert g.adv_GC[0] == pytest.approx([R, R], abs=1e-5)
    assert g.adv_GC[1] == pytest.approx([-R, -R], abs=1e-5)
    assert g.adv_GC[2] == [0.0, 0.0]


def test_gamma_discounts_future_prm():
    g = score_group(group(), SRC, cfg(gamma=0.5), "native")
    assert g.s_GC[0][0] == pytest.approx(0.5 + 0.5 * 0.5 + 2.0)


def test_malformed_chunk_scores_the_floor_not_its_banks_earnings():
    """Silent failure malformed-as-platform-error: a malformed write is a valid cell with low reward (prm = orm = 0), not an
    excluded cell and not what its unchanged bank would have earned (here r1's trap pass, 0.5)."""
    rs = group()
    rs[1].status, rs[1].policy_error_C = "policy_error", [True, False]
    g = score_group(rs, SRC, cfg(), "native")
    assert g.prm_GC[1] == [0.0, 0.5] and g.orm_GC[1] == [0.0, 1.0]
    assert g.s_GC[1] == pytest.approx([0.0, 2.5])
    assert g.valid_GC[1] == [True, True]  # scored, never excluded like an environment error
    assert col(g.adv_GC, 0) == pytest.approx([R, -R, 0.0])
    # the "bank" ablation: the malformed chunk keeps what its (unchanged) bank earned
    b = score_group(rs, SRC, cfg(malformed_score="bank"), "native")
    assert b.s_GC[1] == pytest.approx([0.5, 2.5])
    with pytest.raises(ValueError, match="malformed_score='zero'"):
        cfg(malformed_score="zero").validate()
    with pytest.raises(ValueError, match="1 chunk statuses, want 2"):
        rs[1].policy_error_C = [True]
        score_group(rs, SRC, cfg(), "native")


def test_format_only_control_scores_well_formedness_and_nothing_else():
    """The format-only arm: a malformed chunk 0, a well-formed one 1, whatever its probes, ORM, penalty or
    judge faults; the rubric's differences between the well-formed rollouts give no advantage."""
    rs = group()
    rs[1].status, rs[1].policy_error_C = "policy_error", [True, False]
    # r2: r0's writes, its only chunk-0 probe faulted (that voids a rubric cell, not a format one)
    rs[2] = JudgedRollout("ok", [[FAULT], [0.5]], [[], []], [[True, True]], 0, [1024, 3072])
    rubric = score_group(rs, SRC, cfg(), "native")
    assert rubric.valid_GC[2][0] is False
    g = score_group(rs, SRC, cfg(score_mode="format_only"), "native")
    assert g.s_GC == [[1.0, 1.0], [0.0, 1.0], [1.0, 1.0]] and g.valid_GC == [[True, True]] * 3
    plat = score_group(group(), SRC, cfg(score_mode="format_only"), "native")
    assert plat.valid_GC[2] == [False, False]  # a platform failure stays excluded
    assert col(g.adv_GC, 0)[1] < 0 < col(g.adv_GC, 0)[0] == col(g.adv_GC, 0)[2]
    assert col(g.adv_GC, 1) == [0.0, 0.0, 0.0]  # every chunk-1 write well-formed: no signal
    assert cfg(score_mode="format_only").report_protocol().score_mode == "rubric"


def test_outcome_only_arm_scores_orm_and_penalty_without_probes():
    """The no_prm arm (w_prm=0): r0 and r1 differ on chunk 0's recall and trap probes, which must not
    reach the score; only the attributed ORM and the penalty do."""
    g = score_group(group(), SRC, cfg(w_prm=0.0), "native")
    assert g.prm_GC[:2] == [[0.5, 0.5], [0.5, 0.5]]  # still measured, for the logs
    assert g.s_GC[0] == pytest.approx([2.0, 2.0 - 0.3 * P]) and g.s_GC[1] == pytest.approx([0.0, 2.0])
    rs = group()
    rs[1].recovered_QF = [[True, True]]  # r1 now recovers the question too, with r0's bank sizes,
    rs[1].size_tokens_C = [1024, 3072]
    rs[1].trap_z_CP = [[0.0], []]  # and fails chunk 0's trap: its prm there is 0 against r0's 0.5
    tied = score_group(rs, SRC, cfg(w_prm=0.0), "native")
    assert tied.prm_GC[1][0] == 0.0 and col(tied.adv_GC, 0) == [0.0, 0.0, 0.0]
    assert col(score_group(rs, SRC, cfg(), "native").adv_GC, 0)[0] > 0  # the report's weights see it


def test_group_with_one_valid_rollout_gets_zero_advantage():
    rs = group()
    rs[1] = JudgedRollout("platform_error", [[], []], [[], []], [None], None, [None, None])
    g = score_group(rs, SRC, cfg(), "native")
    assert g.adv_GC == [[0.0, 0.0]] * 3


def test_unmeasured_bank_size_is_excluded_not_zero_penalty():
    rs = group()
    rs[0].size_tokens_C = [1024, None]
    g = score_group(rs, SRC, cfg(), "native")
    assert g.valid_GC[0] == [True, False]
    assert col(g.adv_GC, 1) == [0.0, 0.0, 0.0]  # one valid vote left in column 1


def test_missing_growth_bounds_and_bad_inputs_raise():
    with pytest.raises(KeyError, match="no growth_bounds for harness 'mem0'"):
        score_group(group(), SRC, cfg(), "mem0")
    with pytest.raises(ValueError, match="status 'done'"):
        rs = group()
        rs[0].status = "done"
        score_group(rs, SRC, cfg(), "native")
    with pytest.raises(ValueError, match="does not cover"):
        rs = group()
        rs[0].size_tokens_C = [1]
        score_group(rs, SRC, cfg(), "native")


def test_platform_error_rollout_is_never_scored():
    """Silent failure platform-error-as-reward on its own: with the growth penalty off and no ORM question on chunk 1, nothing
    but the rollout's status makes the platform-failed row invalid (its empty probes give prm 0, valid).
    It must stay out of every cell, advantage and metric; scored, it would get s = 0 and A < 0."""
    rs = group()
    rs[2] = JudgedRollout(
        "platform_error", [[], []], [[], []], [None], None, [None, None]
    )  # as the service fills it
    g = score_group(rs, [[0, 0]], cfg(use_growth_penalty=False), "native")  # both gold facts from chunk 0
    assert g.valid_GC == [[True, True], [True, True], [False, False]]
    assert g.adv_GC[2] == [0.0, 0.0]
    assert col(g.adv_GC, 0) == pytest.approx([R, -R, 0.0], abs=1e-5)  # s[0]: r0 2.5, r1 1.5
    assert col(g.adv_GC, 1) == [0.0, 0.0, 0.0]  # s[1]: r0 = r1 = 0.5 (prm only); no signal
    assert g.metrics[M_EXCL_ROLLOUTS] == pytest.approx(1 / 3)
    assert g.metrics[M_EXCL_CELLS] == pytest.approx(2 / 6)
