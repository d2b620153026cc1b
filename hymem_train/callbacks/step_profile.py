"""Step profile: where each training step's time went and what each phase moved, read back from a
run's `metrics.jsonl`. `python scripts/step_breakdown.py RUN_DIR` prints it; at the end of a stage it
is written to `<run>/step_profile.md` (docs/performance.md, "RL step profile").

Per step: seconds and share of the step per phase (`perf/time_<phase>_s`; `other` = the wall clock
`perf/time_wall_s` minus the timed phases, when the run logged it), and what each phase moved:
rollout: LLM calls, prompt and completion tokens through the gateway, and the engine's batch
occupancy (requests per batched engine call); OPD teacher: the tokens it scored; reward: reader and
judge calls (and tokens, when the endpoints report usage); train: loss tokens, real tokens and real
tokens per second; sync: MiB and seconds. Then a mean row over the training steps, and one over the
steps without a held-out evaluation.

Runs logged before the rollout phase had its own counters fall back to the step's gateway deltas
(note `e` where those include a held-out evaluation) and derive the occupancy from the cumulative
`gateway/mean_batch_size` (note `d`).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from hymem_train.callbacks import Callback

log = logging.getLogger(__name__)

PHASES = ("rollout", "teacher", "reward", "train", "sync", "eval", "checkpoint")
OTHER = "other"  # wall clock minus the timed phases
PROFILE_FILE = "step_profile.md"

# what each phase moved: (key in StepRow.moved, column header)
MOVED_COLUMNS = (
    ("llm_calls", "LLM calls"),
    ("prompt_tokens", "prompt tok"),
    ("completion_tokens", "completion tok"),
    ("batch_occupancy", "engine batch"),
    ("teacher_tokens", "teacher tok"),
    ("reader_calls", "reader calls"),
    ("judge_calls", "judge calls"),
    ("reader_tokens", "reader tok"),
    ("judge_tokens", "judge tok"),
    ("loss_tokens", "loss tok"),
    ("train_tokens", "train tok"),
    ("train_tokens_per_s", "train tok/s"),
    ("sync_mib", "sync MiB"),
    ("sync_s", "sync s"),
)
NOTES = {
    "e": "gateway counts of this step include the held-out evaluation's calls (run logged before rollout/llm_calls)",
    "d": "engine batch occupancy derived from the cumulative gateway/mean_batch_size",
}


@dataclass
class StepRow:
    step: str  # a step number, or the label of a mean row
    seconds: dict[str, float]  # phase -> seconds (OTHER included when the wall clock was logged)
    moved: dict[str, float]  # MOVED_COLUMNS key -> amount
    notes: set[str] = field(default_factory=set)
    has_eval: bool = False

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def share(self, phase: str) -> float:
        t = self.total_s
        return self.seconds.get(phase, 0.0) / t if t > 0 else 0.0


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """Every line of a metrics.jsonl, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _occupancy_from_cumulative(rows: list[dict[str, float]]) -> dict[int, float]:
    """Row index -> that step's requests per engine batch, from the cumulative mean batch size: the
    gateway's batches so far = requests so far / cumulative mean. A restart (resume) resets the sums."""
    out: dict[int, float] = {}
    cum_req = prev_batches = 0.0
    prev_step = -math.inf
    for i, r in enumerate(rows):
        if r.get("step", 0) <= prev_step:  # a resumed run: a fresh gateway, fresh counters
            cum_req = prev_batches = 0.0
        prev_step = r.get("step", 0)
        req, mean = r.get("gateway/requests_ok"), r.get("gateway/mean_batch_size")
        if req is None or not mean:
            continue
        cum_req += req
        batches = cum_req / mean
        if batches - prev_batches > 0:
            out[i] = req / (batches - prev_batches)
        prev_batches = batches
    return out


def breakdown(rows: list[dict[str, float]]) -> list[StepRow]:
    """One StepRow per training step (step >= 1; step 0 is the start-up evaluation)."""
    derived = _occupancy_from_cumulative(rows)
    out = []
    for i, r in enumerate(rows):
        if r.get("step", 0) < 1:
            continue
        sec = {p: r[f"perf/time_{p}_s"] for p in PHASES if f"perf/time_{p}_s" in r}
        if "perf/time_wall_s" in r:
            sec[OTHER] = max(r["perf/time_wall_s"] - sum(sec.values()), 0.0)
        row = StepRow(str(int(r["step"])), sec, {}, has_eval="perf/time_eval_s" in r)
        m = row.moved
        if "rollout/llm_calls" in r:  # the rollout phase's own gateway share
            m["llm_calls"] = r["rollout/llm_calls"]
            m["prompt_tokens"] = r["rollout/prompt_tokens"]
            m["completion_tokens"] = r["rollout/completion_tokens"]
            m["batch_occupancy"] = r["rollout/mean_batch_size"]
        elif "gateway/requests_ok" in r:
            m["llm_calls"] = r["gateway/requests_ok"]
            m["prompt_tokens"] = r["gateway/prompt_tokens"]
            m["completion_tokens"] = r["gateway/completion_tokens"]
            if i in derived:
                m["batch_occupancy"] = derived[i]
                row.notes.add("d")
            if row.has_eval:
                row.notes.add("e")
        if "perf/time_teacher_s" in r and "prompt_tokens" in m:
            # the teacher prefills every sampled segment, prompt and response
            m["teacher_tokens"] = m["prompt_tokens"] + m["completion_tokens"]
        for who in ("reader", "judge"):
            if f"reward/{who}_calls" in r:
                m[f"{who}_calls"] = r[f"reward/{who}_calls"]
            if f"reward/{who}_prompt_tokens" in r:
                m[f"{who}_tokens"] = r[f"reward/{who}_prompt_tokens"] + r[f"reward/{who}_completion_tokens"]
        if "train/num_loss_tokens" in r:
            m["loss_tokens"] = r["train/num_loss_tokens"]
        if "perf/tokens_per_s" in r:
            # exact for one update per step (the recipes); with several PPO updates the rate is their mean
            m["train_tokens_per_s"] = r["perf/tokens_per_s"]
            m["train_tokens"] = r["perf/tokens_per_s"] * r["perf/step_seconds"]
        if "perf/weight_sync_mib" in r:
            m["sync_mib"] = r["perf/weight_sync_mib"]
            m["sync_s"] = r["perf/weight_sync_seconds"]
        out.append(row)
    return out


def mean_row(steps: list[StepRow], label: str) -> StepRow | None:
    """Each phase's and each amount's mean over `steps` (a phase a step did not run counts 0 s), so the
    mean row's shares are shares of the mean step."""
    if not steps:
        return None
    phases = {p for s in steps for p in s.seconds}
    sec = {p: sum(s.seconds.get(p, 0.0) for s in steps) / len(steps) for p in phases}
    keys = {k for s in steps for k in s.moved}
    moved = {}
    for k in keys:
        vs = [s.moved[k] for s in steps if k in s.moved]
        moved[k] = sum(vs) / len(vs)
    notes = set().union(*(s.notes for s in steps))
    return StepRow(label, sec, moved, notes, has_eval=any(s.has_eval for s in steps))


def _num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or v == int(v):
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"


def format_profile(steps: list[StepRow], *, per_step: bool = True) -> str:
    """Two markdown tables (time per phase with shares; what each phase moved), per step and means."""
    rows = list(steps) if per_step else []
    for label, sel in (("mean", steps), ("mean w/o eval", [s for s in steps if not s.has_eval])):
        if (m := mean_row(sel, label)) is not None and (label == "mean" or len(sel) < len(steps)):
            rows.append(m)
    if not rows:
        return "(no training steps)\n"
    phases = [p for p in (*PHASES, OTHER) if any(p in r.seconds for r in rows)]
    lines = [
        "| step | step s | " + " | ".join(f"{p} s (share)" for p in phases) + " |",
        "|---" * (len(phases) + 2) + "|",
    ]
    for r in rows:
        cells = [f"{r.seconds[p]:.2f} ({100 * r.share(p):.0f}%)" if p in r.seconds else "" for p in phases]
        lines.append(f"| {r.step} | {r.total_s:.2f} | " + " | ".join(cells) + " |")
    cols = [(k, h) for k, h in MOVED_COLUMNS if any(k in r.moved for r in rows)]
    lines += [
        "",
        "| step | " + " | ".join(h for _, h in cols) + " | notes |",
        "|---" * (len(cols) + 2) + "|",
    ]
    for r in rows:
        cells = [_num(r.moved[k]) if k in r.moved else "" for k, _ in cols]
        lines.append(f"| {r.step} | " + " | ".join(cells) + f" | {''.join(sorted(r.notes))} |")
    used = set().union(*(r.notes for r in rows))
    lines += [""] + [f"{n}: {NOTES[n]}" for n in sorted(used)]
    return "\n".join(lines).rstrip() + "\n"


def profile_run(run_dir: str | Path, *, per_step: bool = True) -> str:
    return format_profile(breakdown(read_metrics(Path(run_dir) / "metrics.jsonl")), per_step=per_step)


class StepProfileReport(Callback):
    """Writes `<run>/step_profile.md` when training ends, and logs its mean rows."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)

    def on_train_end(self) -> None:
        try:
            (self.dir / PROFILE_FILE).write_text(profile_run(self.dir))
            log.info("step profile (%s):\n%s", self.dir / PROFILE_FILE, profile_run(self.dir, per_step=False))
        except Exception as e:  # a report must never fail a finished run
            log.warning("step profile not written (%s: %s)", type(e).__name__, e)
