"""The reward service: a pool of Ray actors that scores finished rollout groups.

Per rollout (one actor call): open each chunk's bank snapshot through the harness adapter, search it
with that chunk's probes (PRM), search the final bank with the window's ORM questions, then one
batched round of reader calls and one batched round of judge calls. Per group (driver side): the
pure math of `reward.scoring` turns the judged rollouts into prm/orm/pen, s[t], A[i,t] and metrics.

Fault handling (governing rule, silent failure platform-error-as-reward): a platform-failed rollout is not searched, read
or judged, and is excluded from the group's mean/std; a bank that cannot be opened or searched, and
a reader/judge call that fails after bounded retries, excludes that item and is counted. A
policy_error chunk (malformed policy output, silent failure malformed-as-platform-error) is a valid cell with low reward:
prm = orm = 0 (`scoring.malformed_score: floor`; "bank" = whatever its unchanged bank earns).

Legend: G = rollouts, C = chunks of the window.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util import ActorPool

from reward.config import RewardConfig
from reward.counterfactual import chunk_writes, left_out, same_view
from reward.judge import ExactMatchScorer, LlmJudge, OrmVerdict, ProbeItem, QuestionItem, Reader
from reward.llm import ChatClient, Fault
from reward.records import RolloutGroup, RolloutRecord, gold_fact_positions, probe_position, validate_group
from reward.scoring import GroupScores, JudgedRollout, ScoringConfig, score_group
from reward.terms import FAULT

log = logging.getLogger(__name__)


M_READER_CALLS = "reward/reader_calls"  # sum over groups
M_JUDGE_CALLS = "reward/judge_calls"  # sum over groups
# tokens the reader / judge endpoints reported (OpenAI `usage`), sum over groups; 0 for exact match
M_TOKENS = {
    "reader_prompt_tokens": "reward/reader_prompt_tokens",
    "reader_completion_tokens": "reward/reader_completion_tokens",
    "judge_prompt_tokens": "reward/judge_prompt_tokens",
    "judge_completion_tokens": "reward/judge_completion_tokens",
}
M_RETRIES = "reward/llm_retries"  # reader + judge retries, sum over groups
M_READER_FAULTS = "reward/reader_faults"  # items excluded because the reader failed, sum
M_JUDGE_FAULTS = "reward/judge_faults"  # items excluded because the judge failed, sum
M_BANK_FAULTS = "reward/bank_faults"  # items excluded because the bank could not be opened / searched, sum
# orm_mode=counterfactual: reader calls on leave-out views (included in M_READER_CALLS) and the time the
# leave-out readings took (bank reads, deeper search, their reader and judge calls), sums over groups
M_CF_READER_CALLS = "reward/counterfactual_reader_calls"
M_CF_SECONDS = "reward/counterfactual_seconds"

HarnessFactory = Callable[[], Any]  # () -> harnesses.base.Harness, picklable (it is shipped to actors)


@dataclass
class GroupResult:
    window_id: str  # Window.window_id
    chunk_indices: list[int]  # sequence-level chunk of each column
    trajectory_ids: list[str]  # row order of every *_GC table
    scores: GroupScores  # prm/orm/pen/s/valid/adv per (rollout, chunk)
    best_rollout: int | None  # highest sum of s[t] among fully valid rollouts (its bank is promoted)
    metrics: dict[str, float] = field(default_factory=dict)


def best_rollout(s_GC: list[list[float]], valid_GC: list[list[bool]]) -> int | None:
    """Report: the final bank of the rollout with the highest sum of chunk scores becomes the parent.
    Only fully valid rollouts compete (a platform-failed cell leaves the sum unknown); a tie goes to the
    lowest rollout index, so a promotion is reproducible. None when no rollout is fully valid."""
    cands = [(sum(s), -i) for i, (s, v) in enumerate(zip(s_GC, valid_GC, strict=True)) if all(v)]
    return -max(cands)[1] if cands else None


# ------------------------------------------------------------------------------------- one rollout
class BankSearcher:
    """Opens closed bank snapshots read-side through one harness instance and runs searches.

    One harness per actor, reused across snapshots (a sandboxed framework costs a process start).
    A bank that cannot be opened, or a failed search, is a platform fault for the items on it
    (excluded, counted); after a failed open the harness is rebuilt, in case it was the harness
    (e.g. a dead sandbox process) that failed rather than the bank.
    """

    def __init__(self, harness_factory: HarnessFactory):
        self.harness_factory = harness_factory
        self._harness: Any = None

    def search_all(
        self, bank_dir: str, queries: list[str], k: int, where: str, stats: Counter
    ) -> list[list[Any] | Fault]:
        if not queries:
            return []
        if self._harness is None:
            self._harness = self.harness_factory()
        h = self._harness
        try:
            h.open(bank_dir)
        except Exception as e:
            stats["bank_faults"] += len(queries)
            log.warning("%s: cannot open bank %s: %s", where, bank_dir, e)
            self.shutdown()
            return [Fault("bank", f"{where}: open {bank_dir}: {e}", 1)] * len(queries)
        out: list[list[Any] | Fault] = []
        try:
            for q in queries:
                try:
                    out.append(list(h.search(q, k)))
                except Exception as e:
                    stats["bank_faults"] += 1
                    out.append(Fault("bank", f"{where}: search {bank_dir}: {e}", 1))
        finally:
            h.close()  # releases the bank lock; the snapshot stays as it was
        return out

    def read_all(self, bank_dir: str, where: str, stats: Counter) -> list[Any] | Fault:
        """Every entry of a closed bank (read-side); a bank that cannot be read is a Fault."""
        if self._harness is None:
            self._harness = self.harness_factory()
        h = self._harness
        try:
            h.open(bank_dir)
        except Exception as e:
            stats["bank_faults"] += 1
            self.shutdown()
            return Fault("bank", f"{where}: open {bank_dir}: {e}", 1)
        try:
            return list(h.read_all())
        except Exception as e:
            stats["bank_faults"] += 1
            return Fault("bank", f"{where}: read {bank_dir}: {e}", 1)
        finally:
            h.close()

    def shutdown(self) -> None:
        if self._harness is not None:
            try:
                self._harness.close()
                shut = getattr(self._harness, "shutdown", None)
                if callable(shut):
                    shut()
            finally:
                self._harness = None


def judge_rollout(
    record: RolloutRecord,
    group: RolloutGroup,
    *,
    searcher: BankSearcher,
    reader: Reader,
    judge: LlmJudge | ExactMatchScorer,
    search_k: int,
    use_traps: bool,
    rollout_index: int,
    skip_malformed: bool = False,
    counterfactual: bool = False,
) -> tuple[JudgedRollout, dict[str, int]]:
    """Search, read and judge every probe and question of one rollout (no Ray; the actor calls this).

    `skip_malformed` (scoring.malformed_score=floor): the probes of a policy_error chunk are not
    searched, read or judged; its prm is fixed at 0 whatever they would say (silent failure malformed-as-platform-error).
    `counterfactual` (scoring.orm_mode=counterfactual): the ORM questions are also read once per chunk
    with that chunk's writes left out of the final bank's results (reward/counterfactual.py)."""
    w = group.window
    C = len(w.chunk_indices)
    status = record.effective_status
    stats: Counter[str] = Counter()
    if (
        status == "platform_error"
    ):  # excluded whole: nothing to read or judge (silent failure platform-error-as-reward)
        judged = JudgedRollout(
            status,
            [[] for _ in range(C)],
            [[] for _ in range(C)],
            [None] * len(group.questions),
            None,
            [None] * C,
        )
        return judged, dict(stats)
    tag = f"window {w.window_id} rollout {rollout_index} ({record.trajectory_id})"
    reader0, judge0 = Counter(reader.stats), Counter(judge.stats)  # clients may be shared: count deltas
    fixed = {t for t, c in enumerate(record.chunks) if skip_malformed and c.status == "policy_error"}
    probes = [p for p in group.probes if (use_traps or not p.is_trap) and probe_position(w, p) not in fixed]
    probes_by_t: list[list[int]] = [[] for _ in range(C)]
    for j, p in enumerate(probes):
        probes_by_t[probe_position(w, p)].append(j)

    # 1. retrieval through the harness's own search: bank after chunk t for its probes, final bank for ORM
    results: list[list[Any] | Fault] = [Fault("bank", "not searched", 0)] * len(probes)
    for t, snap in enumerate(record.chunks):
        got = searcher.search_all(
            snap.bank_dir, [probes[j].question for j in probes_by_t[t]], search_k, tag, stats
        )
        for j, r in zip(probes_by_t[t], got, strict=True):
            results[j] = r
    t_cf = time.perf_counter()
    views: dict[tuple[int, int], list[Any]] = {}  # (chunk, question) -> leave-out view that differs
    cf_bad: set[int] = set()  # chunks whose leave-out could not be computed (a bank read faulted)
    depth = search_k
    if counterfactual:
        banks = [group.parent_bank_dir, *(c.bank_dir for c in record.chunks)]
        seen = [searcher.read_all(b, tag, stats) if b else [] for b in banks]
        writes_C, after_C = [], []
        for t in range(C):
            if isinstance(seen[t], Fault) or isinstance(seen[t + 1], Fault):
                cf_bad.add(t)
                writes_C.append({})
                after_C.append({})
                continue
            writes_C.append(chunk_writes(seen[t], seen[t + 1]))
            after_C.append({e.id: e.text for e in seen[t + 1]})
        depth = search_k + max((len(w) for w in writes_C), default=0)  # k left after any one leave-out
    q_results = searcher.search_all(
        record.final_bank_dir, [q.question for q in group.questions], depth, tag, stats
    )
    if counterfactual:
        for j, r in enumerate(q_results):
            if isinstance(r, Fault):
                continue
            q_results[j] = r[:search_k]
            for t in range(C):
                v = left_out(r, writes_C[t], after_C[t], search_k)
                if t not in cf_bad and not same_view(v, q_results[j]):
                    views[(t, j)] = v
    t_cf = time.perf_counter() - t_cf if counterfactual else 0.0

    # 2. one batched reader round (gold facts, references and rubrics never reach it)
    items = [(f"probe {p.probe_id} / {tag}", p.question, r) for p, r in zip(probes, results, strict=True)]
    items += [
        (f"question {q.question_id} / {tag}", q.question, r)
        for q, r in zip(group.questions, q_results, strict=True)
    ]
    n_plain = len(items)
    cf_keys = sorted(views)
    items += [
        (
            f"question {group.questions[j].question_id} without chunk {t} / {tag}",
            group.questions[j].question,
            views[(t, j)],
        )
        for t, j in cf_keys
    ]
    todo = [k for k, it in enumerate(items) if not isinstance(it[2], Fault)]
    answers: list[str | Fault] = [it[2] if isinstance(it[2], Fault) else "" for it in items]
    t_read = time.perf_counter()
    for k, a in zip(todo, reader.answer_all([items[k] for k in todo]), strict=True):
        answers[k] = a
        stats["reader_faults"] += isinstance(a, Fault)
    # the leave-out items' share of the batched round's time
    t_cf += (time.perf_counter() - t_read) * len(cf_keys) / max(1, len(todo))
    p_ans, q_ans = answers[: len(probes)], answers[len(probes) : n_plain]
    cf_ans = answers[n_plain:]

    # 3. one batched judge round per item type
    p_todo = [j for j, a in enumerate(p_ans) if not isinstance(a, Fault)]
    p_items = [
        ProbeItem(items[j][0], probes[j].question, probes[j].reference, probes[j].rubric, p_ans[j])
        for j in p_todo
    ]  # type: ignore[arg-type]
    z = [FAULT] * len(probes)
    for j, v in zip(p_todo, judge.score_probes(p_items), strict=True):
        z[j] = FAULT if isinstance(v, Fault) else v
        stats["judge_faults"] += isinstance(v, Fault)
    q_todo = [j for j, a in enumerate(q_ans) if not isinstance(a, Fault)]
    q_items = [
        QuestionItem(
            f"question {group.questions[j].question_id} / {tag}",
            group.questions[j].question,
            group.questions[j].answer,
            [g.fact for g in group.questions[j].gold_facts],
            group.questions[j].rubric,
            q_ans[j],  # type: ignore[arg-type]
            # each fact's atomic answer; "" where unknown, and exact match is then all or nothing
            [g.answer for g in group.questions[j].gold_facts],
        )
        for j in q_todo
    ]
    recovered: list[list[bool] | None] = [None] * len(group.questions)
    for j, v in zip(q_todo, judge.score_questions(q_items), strict=True):
        recovered[j] = v.recovered_F if isinstance(v, OrmVerdict) else None
        stats["judge_faults"] += isinstance(v, Fault)
    recovered_CQF = None
    if counterfactual:
        t_judge = time.perf_counter()
        # a chunk whose leave-out reads like the full bank has the full bank's verdicts
        recovered_CQF = [
            [None if t in cf_bad else recovered[j] for j in range(len(group.questions))] for t in range(C)
        ]
        cf_todo = [n for n, a in enumerate(cf_ans) if not isinstance(a, Fault)]
        for t, j in cf_keys:
            recovered_CQF[t][j] = None  # read again below; stays None (faulted) if the reader failed
        cf_items = []
        for n in cf_todo:
            t, j = cf_keys[n]
            q = group.questions[j]
            facts = [g.fact for g in q.gold_facts]
            answers_F = [g.answer for g in q.gold_facts]
            name = items[n_plain + n][0]
            cf_items.append(QuestionItem(name, q.question, q.answer, facts, q.rubric, cf_ans[n], answers_F))  # type: ignore[arg-type]
        for n, v in zip(cf_todo, judge.score_questions(cf_items), strict=True):
            t, j = cf_keys[n]
            recovered_CQF[t][j] = v.recovered_F if isinstance(v, OrmVerdict) else None
            stats["judge_faults"] += isinstance(v, Fault)
        stats["counterfactual_reader_calls"] = len(cf_keys)
        stats["counterfactual_ms"] = round(1000 * (t_cf + time.perf_counter() - t_judge))

    recall_z_CR: list[list[float]] = [[] for _ in range(C)]
    trap_z_CP: list[list[float]] = [[] for _ in range(C)]
    for t in range(C):
        for j in probes_by_t[t]:
            (trap_z_CP if probes[j].is_trap else recall_z_CR)[t].append(z[j])
    judged = JudgedRollout(
        status=status,
        recall_z_CR=recall_z_CR,
        trap_z_CP=trap_z_CP,
        recovered_QF=recovered,
        size_before_tokens=group.parent_size_tokens,
        size_tokens_C=[c.size_tokens if c.status != "platform_error" else None for c in record.chunks],
        policy_error_C=[c.status == "policy_error" for c in record.chunks],
        recovered_CQF=recovered_CQF,
    )
    reader_d, judge_d = reader.stats - reader0, judge.stats - judge0
    stats["reader_calls"] = reader_d["calls"]
    stats["judge_calls"] = judge_d["calls"]
    for who, d in (("reader", reader_d), ("judge", judge_d)):
        for kind in ("prompt_tokens", "completion_tokens"):
            stats[f"{who}_{kind}"] = d[kind]
    stats["retries"] = reader_d["retries"] + judge_d["retries"]
    return judged, dict(stats)


class RewardWorker:
    """One reward actor: owns a reader and a judge client; scores one rollout per call."""

    def __init__(self, cfg: RewardConfig, harness_factory: HarnessFactory, manifest: Any = None):
        self.cfg = cfg
        self.searcher = BankSearcher(harness_factory)
        self.manifest = manifest

    def judge(
        self,
        record: RolloutRecord,
        group: RolloutGroup,
        rollout_index: int,
        scoring: ScoringConfig | None = None,
    ) -> tuple[JudgedRollout, dict[str, int]]:
        sc = scoring or self.cfg.scoring
        # fresh clients per call: stats are per rollout, and no state leaks between groups
        reader = Reader(ChatClient(self.cfg.reader))
        if self.cfg.judge_kind == "exact_match":
            judge: LlmJudge | ExactMatchScorer = ExactMatchScorer(self.manifest, where="reward service")
        else:
            judge = LlmJudge(ChatClient(self.cfg.judge))
        return judge_rollout(
            record,
            group,
            searcher=self.searcher,
            reader=reader,
            judge=judge,
            search_k=self.cfg.search_k,
            use_traps=sc.use_traps,
            rollout_index=rollout_index,
            skip_malformed=sc.malformed_score == "floor",
            counterfactual=sc.orm_mode == "counterfactual",
        )

    def shutdown(self) -> None:
        self.searcher.shutdown()


def finish_group(
    group: RolloutGroup, judged: list[JudgedRollout], stats: list[dict[str, int]], cfg: ScoringConfig
) -> GroupResult:
    """Driver-side: the pure math over a group's judged rollouts, plus the call/fault counters."""
    src = [gold_fact_positions(group.window, q) for q in group.questions]
    scores = score_group(judged, src, cfg, group.harness)
    total: Counter[str] = Counter()
    for s in stats:
        total.update(s)
    metrics = dict(scores.metrics)
    metrics.update(
        {
            M_READER_CALLS: float(total["reader_calls"]),
            M_JUDGE_CALLS: float(total["judge_calls"]),
            M_RETRIES: float(total["retries"]),
            M_READER_FAULTS: float(total["reader_faults"]),
            M_JUDGE_FAULTS: float(total["judge_faults"]),
            M_BANK_FAULTS: float(total["bank_faults"]),
            M_CF_READER_CALLS: float(total["counterfactual_reader_calls"]),
            M_CF_SECONDS: total["counterfactual_ms"] / 1000.0,
            **{name: float(total[k]) for k, name in M_TOKENS.items()},
        }
    )
    best = best_rollout(scores.s_GC, scores.valid_GC)
    excluded = metrics.get("reward/excluded_probe_share", 0.0)
    if excluded and not math.isnan(excluded):
        log.warning("window %s: %.1f%% of probes excluded (platform faults)", group.window_id, 100 * excluded)
    return GroupResult(
        window_id=group.window_id,
        chunk_indices=list(group.window.chunk_indices),
        trajectory_ids=[r.trajectory_id for r in group.rollouts],
        scores=scores,
        best_rollout=best,
        metrics=metrics,
    )


class RewardService:
    """A pool of `RewardWorker` Ray actors. The caller owns `ray.init()` (local or a cluster)."""

    def __init__(self, cfg: RewardConfig, harness_factory: HarnessFactory, *, manifest: Any = None):
        cfg.validate()
        if cfg.judge_kind == "exact_match":
            ExactMatchScorer(manifest, where="reward service")  # refuse at start-up, not in an actor
        if not ray.is_initialized():
            raise RuntimeError("RewardService: call ray.init() first (tests: ray.init(num_cpus=2))")
        self.cfg = cfg
        actor_cls = ray.remote(RewardWorker).options(num_cpus=cfg.num_cpus_per_actor)
        self.actors = [actor_cls.remote(cfg, harness_factory, manifest) for _ in range(cfg.num_actors)]
        self.pool = ActorPool(self.actors)

    def score(self, group: RolloutGroup) -> GroupResult:
        return self.score_groups([group])[0]

    def score_groups(
        self, groups: Sequence[RolloutGroup], scoring: ScoringConfig | None = None
    ) -> list[GroupResult]:
        """Every rollout of every group goes through the pool; results come back in group order.
        `scoring` replaces the service's scoring config for this call (held-out evaluation)."""
        sc = scoring or self.cfg.scoring
        for g in groups:
            validate_group(g)  # silent failure chunk-unmapped raises here, before any call is made
        refs = [ray.put(g) for g in groups]  # shipped once, not once per rollout
        tasks = [(gi, i) for gi, g in enumerate(groups) for i in range(len(g.rollouts))]
        out = list(
            self.pool.map(
                lambda a, t: a.judge.remote(groups[t[0]].rollouts[t[1]], refs[t[0]], t[1], sc), tasks
            )
        )
        results = []
        k = 0
        for g in groups:
            n = len(g.rollouts)
            judged = [o[0] for o in out[k : k + n]]
            stats = [o[1] for o in out[k : k + n]]
            k += n
            results.append(finish_group(g, judged, stats, sc))
        return results

    def shutdown(self) -> None:
        ray.get([a.shutdown.remote() for a in self.actors])
        for a in self.actors:
            ray.kill(a)
        self.actors = []
