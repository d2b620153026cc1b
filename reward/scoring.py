"""Scores of one finished rollout group from its judged items: prm/orm/pen -> s[t] -> A[i,t].

Pure: no I/O, no model. The reward service fills `JudgedRollout`s (reader + judge results) and
calls `score_group`; every ablation switch of the report lives in `ScoringConfig`.

Legend: G = rollouts, C = chunks of the window, R = recall probes of a chunk, P = trap probes of a
chunk, Q = ORM questions of the window, F = gold facts of one question.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from reward.advantage import ADVANTAGE_LEVELS, chunk_score_valid, chunk_scores, grpo_advantages
from reward.terms import (
    binarize,
    growth_penalty,
    growth_ratio,
    is_fault,
    orm_attributed,
    orm_broadcast,
    orm_counterfactual,
    prm,
)

ROLLOUT_STATUSES = ("ok", "policy_error", "platform_error")
# "counterfactual" (beyond the report): a chunk is credited with the ORM answers its writes change
# (reward/counterfactual.py)
ORM_MODES = ("attributed", "broadcast", "counterfactual")
# "format_only" (a control, beyond the report): s[t] = 1 when chunk t's write was well-formed, 0 when it was
# malformed policy output; probes, ORM and the growth penalty are not looked at
SCORE_MODES = ("rubric", "binary", "format_only")
# How a chunk whose write was malformed policy output (silent failure malformed-as-platform-error) is scored:
#   "floor": prm[t] = orm[t] = 0 (silent failure malformed-as-platform-error, docs/glossary.md: "a valid trajectory with low reward");
#   "bank":  whatever its unchanged bank earns (our first reading; kept as an ablation).
# With "bank", garbage earns every trap an unchanged bank passes, so it costs nothing over a wrong write
# and GRPO reinforced it (docs/log/findings.md, "Reward: scoring a malformed write by its unchanged bank").
# With "floor" garbage ranks below every valid write; a valid abstention ({"op": "NONE"}) still earns
# its traps, so storing nothing is never punished.
MALFORMED_SCORES = ("floor", "bank")

# Metric names. Cross-rank / cross-group reduction: mean, weighted by the metric's
# own denominator where one is stated (the service logs per group; the trainer averages groups).
M_PRM = "reward/prm"  # mean prm[t] over valid cells
M_ORM = "reward/orm"  # mean orm[t] over valid cells
M_PEN = "reward/pen"  # mean pen[t] over valid cells
M_SCORE = "reward/s"  # mean s[t] over valid cells
M_TRAP_PASS = "reward/trap_pass_rate"  # share of judged trap probes with z >= trap_pass_threshold
M_EXCL_PROBES = "reward/excluded_probe_share"  # faulted probes / probes of valid rollouts
M_EXCL_QUESTIONS = "reward/excluded_question_share"  # faulted ORM questions / questions of valid rollouts
M_EXCL_ROLLOUTS = "reward/excluded_rollout_share"  # platform-failed rollouts / rollouts
M_EXCL_CELLS = "reward/excluded_cell_share"  # invalid (rollout, chunk) cells / all cells
# valid cells whose advantage is exactly 0 (their chunk column scored alike, or had < 2 valid votes):
# cells that teach the policy nothing. Near 1 means GRPO has no signal, whatever the reward's level.
M_ZERO_ADV = "reward/zero_advantage_share"
# share of the ORM credit (sum of |orm[t]| over valid cells) on chunks that introduced none of the window's
# gold facts: 0 by construction under attributed ORM; where broadcast and counterfactual credit differs
M_ORM_OFF_SOURCE = "reward/orm_credit_off_source_share"


@dataclass
class GrowthBounds:
    """Per-harness bounds of the growth penalty (report: l_h, u_h)."""

    lower: float  # l_h: growth ratio at or below which pen = 0
    upper: float  # u_h: growth ratio at or above which pen = 1
    floor_tokens: int = 2048  # B_{t-1} is floored at this many tokens so an empty parent bank has a ratio


@dataclass
class ScoringConfig:
    """Reward weights and the report's ablation switches (each one flips one knob)."""

    growth_bounds: dict[str, GrowthBounds]  # harness name -> (l_h, u_h); a harness without bounds fails
    w_prm: float = 1.0  # weight of the (discounted) prm sum in s[t]
    w_orm: float = 2.0  # weight of orm[t] in s[t]
    w_pen: float = 0.3  # weight of the growth penalty in s[t]
    gamma: float = 0.0  # discount of future prm[k>t] in s[t]; 0 = only this chunk's probes
    eps: float = 1e-6  # added to the std in the advantage denominator
    advantage_level: str = "chunk"  # "chunk" (report) | "window" (ablation: trajectory-level GRPO)
    orm_mode: str = "attributed"  # "attributed" (report) | "broadcast" (ablation) | "counterfactual"
    use_traps: bool = True  # False = ablation "probes only": trap probes are neither run nor scored
    use_growth_penalty: bool = True  # False = ablation "no growth penalty" (pen[t] = 0)
    # "rubric" (report) | "binary" (ablation: scores thresholded to 0/1) | "format_only" (control: only
    # whether each chunk's write was well-formed)
    score_mode: str = "rubric"
    binary_threshold: float = 0.5  # binary mode: a score >= this counts 1, else 0
    trap_pass_threshold: float = 0.5  # a trap probe "passes" (metric only) when z >= this
    malformed_score: str = "floor"  # policy_error chunk: "floor" (prm = orm = 0) | "bank" (ablation)

    def validate(self) -> None:
        for key, val, allowed in (
            ("advantage_level", self.advantage_level, ADVANTAGE_LEVELS),
            ("orm_mode", self.orm_mode, ORM_MODES),
            ("score_mode", self.score_mode, SCORE_MODES),
            ("malformed_score", self.malformed_score, MALFORMED_SCORES),
        ):
            if val not in allowed:
                raise ValueError(f"reward config: {key}={val!r} not in {allowed}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"reward config: gamma={self.gamma} not in [0, 1]")
        for h, b in self.growth_bounds.items():
            if not b.upper > b.lower:
                raise ValueError(f"reward config: growth_bounds.{h}: upper={b.upper} <= lower={b.lower}")
            if b.floor_tokens < 1:
                raise ValueError(f"reward config: growth_bounds.{h}.floor_tokens must be >= 1")

    def report_protocol(self) -> ScoringConfig:
        """This config with every ablation switch back at the report's setting (weights and bounds kept).
        Held-out evaluation scores with it, so runs that ablate the training reward share one yardstick."""
        return dataclasses.replace(
            self,
            advantage_level="chunk",
            orm_mode="attributed",
            use_traps=True,
            use_growth_penalty=True,
            score_mode="rubric",
            malformed_score="floor",
        )

    def bounds_for(self, harness: str) -> GrowthBounds:
        if harness not in self.growth_bounds:
            raise KeyError(
                f"reward config: no growth_bounds for harness {harness!r} (have {sorted(self.growth_bounds)})"
            )
        return self.growth_bounds[harness]


@dataclass
class JudgedRollout:
    """One rollout after the reader and judge ran; FAULT / None mark faulted items."""

    status: str  # ok | policy_error | platform_error (a platform error anywhere voids the row)
    recall_z_CR: list[list[float]]  # judge score per recall probe, per chunk (FAULT = faulted)
    trap_z_CP: list[list[float]]  # judge score per trap probe, per chunk (FAULT = faulted)
    recovered_QF: list[list[bool] | None]  # per ORM question: recovered flag per gold fact; None = faulted
    size_before_tokens: int | None  # parent bank size in tokens (before chunk 0)
    size_tokens_C: list[int | None]  # bank size in tokens after each chunk; None = unknown (platform fault)
    # per chunk: its write was malformed policy output (chunk status policy_error); [] = none was
    policy_error_C: list[bool] = field(default_factory=list)
    # orm_mode=counterfactual: per chunk, recovered_QF read with that chunk's writes left out
    recovered_CQF: list[list[list[bool] | None]] | None = None


@dataclass
class GroupScores:
    prm_GC: list[list[float]]
    orm_GC: list[list[float]]
    pen_GC: list[list[float]]
    s_GC: list[list[float]]  # s[t]; meaningless where valid_GC is False
    valid_GC: list[list[bool]]
    adv_GC: list[list[float]]  # A[i,t]; 0 where invalid
    metrics: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def score_group(
    rollouts: list[JudgedRollout], source_pos_QF: list[list[int | None]], cfg: ScoringConfig, harness: str
) -> GroupScores:
    """All per-chunk scores, advantages and metrics of one window's rollout group."""
    if not rollouts:
        raise ValueError("score_group: empty rollout group")
    C = len(rollouts[0].size_tokens_C)
    binthr = cfg.binary_threshold if cfg.score_mode == "binary" else None
    bounds = cfg.bounds_for(harness) if cfg.use_growth_penalty else None
    prm_GC, orm_GC, pen_GC, s_GC, valid_GC = [], [], [], [], []
    n_probes = n_probe_faults = n_q = n_q_faults = 0
    trap_verdicts: list[bool] = []
    for i, r in enumerate(rollouts):
        if r.status not in ROLLOUT_STATUSES:
            raise ValueError(f"score_group: rollout {i} status {r.status!r} not in {ROLLOUT_STATUSES}")
        if not (len(r.size_tokens_C) == len(r.recall_z_CR) == len(r.trap_z_CP) == C):
            raise ValueError(f"score_group: rollout {i} does not cover the window's {C} chunks")
        if r.policy_error_C and len(r.policy_error_C) != C:
            raise ValueError(f"score_group: rollout {i} has {len(r.policy_error_C)} chunk statuses, want {C}")
        if len(r.recovered_QF) != len(source_pos_QF):
            raise ValueError(
                f"score_group: rollout {i} has {len(r.recovered_QF)} ORM answers, want {len(source_pos_QF)}"
            )
        failed = r.status == "platform_error"
        prm_C, prm_ok = [], []
        for t in range(C):
            rec = [binarize(z, binthr) if binthr is not None else z for z in r.recall_z_CR[t]]
            trp = (
                [binarize(z, binthr) if binthr is not None else z for z in r.trap_z_CP[t]]
                if cfg.use_traps
                else []
            )
            v, ok = prm(rec, trp, use_traps=cfg.use_traps)
            prm_C.append(v)
            prm_ok.append(ok)
            if not failed:
                items = list(r.recall_z_CR[t]) + (list(r.trap_z_CP[t]) if cfg.use_traps else [])
                n_probes += len(items)
                n_probe_faults += sum(is_fault(z) for z in items)
                if cfg.use_traps:
                    trap_verdicts += [z >= cfg.trap_pass_threshold for z in r.trap_z_CP[t] if not is_fault(z)]
        if cfg.orm_mode == "attributed":
            orm_C, orm_ok = orm_attributed(r.recovered_QF, source_pos_QF, C, binary_threshold=binthr)
        elif cfg.orm_mode == "counterfactual":
            if r.recovered_CQF is None and failed:
                orm_C, orm_ok = [0.0] * C, [False] * C  # nothing was read: excluded below anyway
            elif r.recovered_CQF is None:
                raise ValueError(
                    f"score_group: rollout {i} has no leave-out readings (orm_mode=counterfactual)"
                )
            else:
                orm_C, orm_ok = orm_counterfactual(
                    r.recovered_QF, r.recovered_CQF, C, binary_threshold=binthr
                )
        else:
            orm_C, orm_ok = orm_broadcast(r.recovered_QF, C, binary_threshold=binthr)
        if cfg.malformed_score == "floor":
            for t, bad in enumerate(r.policy_error_C):
                if bad:  # low reward, valid cell (never excluded: silent failure malformed-as-platform-error is not an environment error)
                    prm_C[t], prm_ok[t], orm_C[t], orm_ok[t] = 0.0, True, 0.0, True
        if not failed:
            n_q += len(r.recovered_QF)
            n_q_faults += sum(q is None for q in r.recovered_QF)
        pen_C, pen_ok = [], []
        before = r.size_before_tokens
        for t in range(C):
            after = r.size_tokens_C[t]
            if bounds is None:
                pen_C.append(0.0)
                pen_ok.append(True)
            elif before is None or after is None:
                pen_C.append(0.0)
                pen_ok.append(False)  # size unknown = platform fault, not a zero penalty
            else:
                pen_C.append(
                    growth_penalty(
                        growth_ratio(before, after, bounds.floor_tokens), bounds.lower, bounds.upper
                    )
                )
                pen_ok.append(True)
            before = after
        s_C = chunk_scores(
            prm_C, orm_C, pen_C, w_prm=cfg.w_prm, w_orm=cfg.w_orm, w_pen=cfg.w_pen, gamma=cfg.gamma
        )
        ok_C = chunk_score_valid(prm_ok, orm_ok, pen_ok, gamma=cfg.gamma)
        if cfg.score_mode == "format_only":  # a judge fault cannot void a cell the score never reads
            bad_C = r.policy_error_C or [False] * C
            s_C, ok_C = [0.0 if bad else 1.0 for bad in bad_C], [True] * C
        if failed:
            ok_C = [False] * C
        prm_GC.append(prm_C)
        orm_GC.append(orm_C)
        pen_GC.append(pen_C)
        s_GC.append(s_C)
        valid_GC.append(ok_C)
    adv_GC = grpo_advantages(s_GC, valid_GC, level=cfg.advantage_level, eps=cfg.eps)
    cells = [(i, t) for i in range(len(rollouts)) for t in range(C) if valid_GC[i][t]]
    n_failed = sum(r.status == "platform_error" for r in rollouts)
    sources = {p for src_F in source_pos_QF for p in src_F if p is not None}
    credit = sum(abs(orm_GC[i][t]) for i, t in cells)
    off = sum(abs(orm_GC[i][t]) for i, t in cells if t not in sources)
    metrics = {
        M_PRM: _mean([prm_GC[i][t] for i, t in cells]),
        M_ORM: _mean([orm_GC[i][t] for i, t in cells]),
        M_PEN: _mean([pen_GC[i][t] for i, t in cells]),
        M_SCORE: _mean([s_GC[i][t] for i, t in cells]),
        M_TRAP_PASS: _mean([float(v) for v in trap_verdicts]) if trap_verdicts else math.nan,
        M_EXCL_PROBES: n_probe_faults / n_probes if n_probes else 0.0,
        M_EXCL_QUESTIONS: n_q_faults / n_q if n_q else 0.0,
        M_EXCL_ROLLOUTS: n_failed / len(rollouts),
        M_EXCL_CELLS: 1.0 - len(cells) / (len(rollouts) * C) if C else 0.0,
        M_ZERO_ADV: _mean([float(adv_GC[i][t] == 0.0) for i, t in cells]) if cells else 1.0,
        M_ORM_OFF_SOURCE: off / credit if credit else 0.0,
    }
    return GroupScores(prm_GC, orm_GC, pen_GC, s_GC, valid_GC, adv_GC, metrics)
