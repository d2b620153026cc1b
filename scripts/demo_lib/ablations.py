"""The ablation table at tiny scale on CPU: every `configs/exp/ablation_*.yaml` x N seeds, each an RL
run from the same OPD checkpoint of `make demo`, against the baseline (the demo's RL recipe).

Each overlay changes one knob of the full-size `hy_memory_rl` (tests/config/test_configs.py checks
it); here that one knob is read off the typed configs (`config_diff`) and applied to the tiny RL
recipe (`+exp=demo_rl`). Path-valued knobs get their tiny-scale counterpart (`init_checkpoint`: the
demo's SFT student, the checkpoint OPD started from); a knob with no tiny-scale counterpart is shown
as "not run" with the reason. Seeds: `run.seed` (it reaches every seed of the stage). Runs that
finished are reused, so an interrupted table resumes.

What the table reads: per seed, one `python -m hymem_train.evaluate +exp=evaluate_demo` over the
demo's held-out sequences with the OPD start and every ablation's final checkpoint as writers, so
every arm is measured by the same reader, judge and items (the bank metrics of
reward/bank_metrics.py, from the banks themselves). Each ablation's registered direction
(`PREDICTED`, the table of docs/ablation_predictions.md) is checked on its own metric.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hymem_train.evaluation.config import WriterConfig
from hymem_train.evaluation.matrix import writer_identity
from scripts.demo_lib.pipeline import _run, growth_overrides

# Bumped when what a finished run means changes, so an old run is re-run rather than reused.
# v3: no in-run held-out evaluation; the table reads the per-seed writer-swap evaluation's bank metrics.
RUN_VERSION = "v3"
RECIPE = Path(__file__).resolve().parents[2] / "configs" / "exp" / "demo_rl.yaml"  # every run's base
BASELINE = "baseline"
START = "opd"  # the writer every RL run starts from, evaluated beside them
ZERO_ADV = "reward/zero_advantage_share"


@dataclass(frozen=True)
class Prediction:
    """A direction registered before the runs: the sign of (ablation - baseline) on one bank metric."""

    metric: str  # a metric of reward/bank_metrics.py, on the held-out banks
    sign: str  # "+", "-" or "0" (no separation: the interval covers 0)
    why: str
    identical: bool = False  # equal to the baseline by construction: every metric, every seed, exactly


# Mirrors docs/ablation_predictions.md (registered before any ablation ran on the testbed; a test holds
# the two equal). Never edited after a result: a direction that fails is reported, not re-registered.
PREDICTED = {
    "no_traps": Prediction(
        "false_memory_resistance", "-", "only the trap probes penalise the small talk the teacher taught"
    ),
    "window_level_grpo": Prediction(
        "false_memory_resistance", "-", "a window-level advantage dilutes the trap decision of one chunk"
    ),
    "no_growth_penalty": Prediction(
        "bank_records", "+", "the penalty is the only term against records the reader ignores (small)"
    ),
    "sft_init": Prediction("memory_recall", "0", "OPD did not change the student's recall here"),
    "broadcast_orm": Prediction("memory_recall", "0", "held-out ORM is small and no writer keeps a history"),
    "binary_reward": Prediction(
        "false_memory_resistance", "0", "the demo's judge is exact match, already 0/1", identical=True
    ),
    "one_vote_loss": Prediction(
        "false_memory_resistance", "0", "one LLM call per chunk: a chunk is a segment", identical=True
    ),
    "counterfactual_orm": Prediction(
        "history_kept", "0", "credit reaches the overwriting chunk, but no writer keeps a history"
    ),
    "no_prm": Prediction(
        "false_memory_resistance", "-", "without the per-chunk probes no term scores a chunk's small talk"
    ),
    "format_only": Prediction(
        "false_memory_resistance", "-", "well-formedness does not tell small talk from facts"
    ),
    "four_rollouts": Prediction(
        "false_memory_resistance", "-", "half the samples per step and more tied groups: less trap signal"
    ),
    "strong_growth_penalty": Prediction(
        "bank_records", "-", "ten times the penalty on writes that more than double a bank: fewer records"
    ),
}


def seeds_of(name: str, seeds: int, identical_seeds: int, first_seed: int = 0) -> range:
    """The seeds an arm runs, from `first_seed` on (a design read on fresh seeds starts past the ones
    already run): an arm registered as identical to the baseline by construction runs only
    `identical_seeds` of them, since one seed already shows an exact equality (or breaks it), and its
    runs are about a tenth of the table's wall time."""
    if first_seed < 0:
        raise ValueError(f"first_seed={first_seed}: run seeds start at 0")
    p = PREDICTED.get(name)
    n = min(seeds, identical_seeds) if p is not None and p.identical else seeds
    return range(first_seed, first_seed + n)


# shown for every arm beside its own metric: what each knob could move
CONTEXT_METRICS = (
    "memory_recall",
    "false_memory_resistance",
    "history_kept",
    "op_invalid",
    "bank_records",
    "unparsed_share",
)


@dataclass
class Ablation:
    name: str
    knob: str  # the dotted key the overlay changes ("" for the baseline)
    overrides: list[str]  # the knob at tiny scale, as Hydra overrides
    skip_reason: str = ""  # non-empty: not run at tiny scale, and why
    runs: dict[int, Path] = field(default_factory=dict)  # seed -> finished run directory
    seconds: list[float] = field(default_factory=list)
    # seed -> bank metric -> held-out value (filled by `evaluate_seeds`)
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    zero_adv: list[float] = field(default_factory=list)  # per seed: mean zero-advantage share over steps
    paired: bool = True  # starts from the baseline's checkpoint, so differences are paired by seed


def _fmt(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def discover(root: Path, config_dir: Path | None = None) -> list[Ablation]:
    """The baseline and one `Ablation` per overlay, with its knob translated to the tiny scale."""
    from hymem_train.config import CONFIG_DIR, compose, config_diff, to_typed
    from hymem_train.run_config import RlConfig

    cdir = Path(config_dir or CONFIG_DIR)
    base = to_typed(compose("rl", ["+exp=hy_memory_rl"]), RlConfig)
    out = [Ablation(BASELINE, "", [])]
    for p in sorted((cdir / "exp").glob("ablation_*.yaml")):
        name = p.stem.removeprefix("ablation_")
        cfg = to_typed(compose("rl", [f"+exp={p.stem}"]), RlConfig)
        diff = config_diff(base, cfg, atomic=("harnesses", "data.per_harness"))
        diff = {k: v for k, v in diff.items() if not k.startswith("run.")}
        if set(diff) == {"harnesses", "data.per_harness"}:  # a harness is declared with its dataset
            diff = {"harnesses": diff["harnesses"]}
        if len(diff) != 1:
            raise ValueError(f"{p}: an ablation overlay changes one knob; this one changes {sorted(diff)}")
        [(knob, (_, value))] = diff.items()
        if knob == "init_checkpoint":  # generic SFT init: the demo's SFT student, where OPD started
            out.append(Ablation(name, knob, [f"init_checkpoint={root}/student_init/final"], paired=False))
        elif knob == "harnesses":
            out.append(Ablation(name, knob, [], skip_reason="the tiny recipe trains in one harness (native)"))
        else:
            out.append(Ablation(name, knob, [f"{knob}={_fmt(value)}"]))
    return out


def _start_checkpoint(root: Path) -> Path:
    # resolved: a step checkpoint finds its run's config.yaml beside its real parent, not a link's
    return (root / "opd" / "final").resolve()


def run_table(
    root: Path,
    out: Path,
    *,
    seeds: int = 3,
    steps: int = 24,
    only: list[str] | None = None,
    extra: list[str] | None = None,
    jobs: int = 1,
    evaluate: bool = True,
    identical_seeds: int = 1,
    first_seed: int = 0,
) -> list[Ablation]:
    """Every ablation x seed (`seeds_of`) as a real `python -m hymem_train.rl` run (reused when already
    finished), `jobs` at a time (each with cores/jobs torch threads), then `evaluate_seeds`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

    for need in (root / "opd" / "final", root / "sft" / "final", root / "data" / "prompts" / "native"):
        if not need.exists():
            raise FileNotFoundError(
                f"{need} is missing: run `make demo` first (the ablations start from its OPD)"
            )
    growth, _ = growth_overrides(root / "opd")
    table = [a for a in discover(root) if not only or a.name in only]
    threads = str(max(1, (os.cpu_count() or 1) // max(1, jobs)))
    tasks = []
    for seed in range(first_seed, first_seed + seeds):  # seed-major: an interrupted table has whole seeds
        for a in table:
            if a.skip_reason or seed not in seeds_of(a.name, seeds, identical_seeds, first_seed):
                continue
            run_dir = out / a.name / f"seed{seed}"
            cmd = [
                sys.executable,
                "-m",
                "hymem_train.rl",
                "+exp=demo_rl",
                f"data.path={root}/data/prompts/native",
                "data.eval_path=''",
                f"init_checkpoint={_start_checkpoint(root)}",
                f"reader_model.path={root}/sft/final",
                f"run.output_dir={run_dir}",
                f"run.name=ablation_{a.name}_seed{seed}",
                f"run.seed={seed}",
                f"num_steps={steps}",
                f"save_every={steps}",
                "logging.wandb_mode=disabled",
                *growth,
                *a.overrides,
                *(extra or []),
            ]
            tasks.append((a, seed, run_dir, cmd))

    def one(task) -> None:
        a, seed, run_dir, cmd = task
        # the recipe file too: a run from the demo's earlier RL settings (its lr) is not reused
        # and the checkpoints it starts from: a demo retrained under the same root keeps every path
        key = {"run_version": RUN_VERSION, "cmd": cmd[1:], "recipe": RECIPE.read_text(), "from": starts}
        stamp = run_dir / "ablation_key.json"
        if reusable(run_dir, steps, key):
            return
        if run_dir.exists():  # another command or version: it would resume, not restart
            shutil.rmtree(run_dir)
        t0 = time.perf_counter()
        print(f"  {a.name} seed {seed}: {' '.join(a.overrides) or '(the demo recipe)'}", flush=True)
        log = out / "logs" / f"{a.name}_seed{seed}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": threads}
        with log.open("w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"ablation {a.name} seed {seed} failed (exit {r.returncode}); see {log}")
        (run_dir / "wall_seconds").write_text(f"{time.perf_counter() - t0:.1f}")
        stamp.write_text(json.dumps(key))

    starts = [
        writer_identity(WriterConfig(name=n, checkpoint=str(p)))
        for n, p in ((START, _start_checkpoint(root)), ("sft_student", root / "student_init" / "final"))
    ]
    for a, seed, run_dir, _ in tasks:
        a.runs[seed] = run_dir
    held, start = root / "data" / "eval" / "native", _start_checkpoint(root)
    by_seed: dict[int, list] = {}
    for task in tasks:
        by_seed.setdefault(task[1], []).append(lambda task=task: one(task))
    run_by_seed(
        by_seed, jobs, (lambda seed: evaluate_seed(table, seed, held, start, out)) if evaluate else None
    )
    for a, _seed, run_dir, _ in tasks:
        wall = run_dir / "wall_seconds"
        a.seconds.append(float(wall.read_text()) if wall.exists() else float("nan"))
    if evaluate:
        evaluate_seeds(table, held, start, out)  # reads what the evaluations above wrote
    return table


def run_by_seed(
    jobs_of: dict[int, list[Callable[[], None]]],
    jobs: int,
    after_seed: Callable[[int], None] | None = None,
) -> None:
    """Every seed's jobs, `jobs` at a time, in seed order. `after_seed(seed)` (one at a time, on its own
    thread) starts as soon as that seed's jobs have finished, beside the later seeds' jobs: an RL run
    leaves part of its core idle while its Ray actors hand rollouts back, and a seed's evaluation fills
    it. The first failure drops the jobs not yet started and is re-raised."""
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool, ThreadPoolExecutor(1) as after:
        futures = {seed: [pool.submit(j) for j in jobs_of[seed]] for seed in sorted(jobs_of)}
        started = []
        try:
            for seed, fs in futures.items():
                for f in fs:
                    f.result()
                if after_seed is not None:
                    started.append(after.submit(after_seed, seed))
            for f in started:
                f.result()
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


def recipe_settings(text: str) -> dict:
    """What a recipe file sets: its values and its Hydra package line, without its comments (editing a
    comment does not make every finished run stale)."""
    import yaml

    return {
        "package": [ln.strip() for ln in text.splitlines() if ln.strip().startswith("# @package")],
        "values": yaml.safe_load(text),
    }


def reusable(run_dir: Path, steps: int, key: dict) -> bool:
    """A finished run whose stamp (`ablation_key.json`) has this key: the same command, start checkpoints
    and run version, and a recipe that sets the same values (its comments aside)."""
    stamp = run_dir / "ablation_key.json"
    if not (_finished(run_dir, steps) and stamp.exists()):
        return False
    old = json.loads(stamp.read_text())
    if {k: v for k, v in old.items() if k != "recipe"} != {k: v for k, v in key.items() if k != "recipe"}:
        return False
    return recipe_settings(old.get("recipe", "")) == recipe_settings(key["recipe"])


def _finished(run_dir: Path, steps: int) -> bool:
    rows = _history(run_dir)
    return bool(rows) and rows[-1]["step"] == steps and (run_dir / "final").exists()


def evaluate_seeds(table: list[Ablation], held: Path, start: Path, out: Path) -> None:
    """Per seed, one writer-swap evaluation over the held-out data with the bounds, the OPD start and
    every arm's final checkpoint (`evaluate_seed`); fills each arm's `metrics` and `zero_adv`."""
    for seed in sorted({s for a in table for s in a.runs}):
        arms = [a for a in table if seed in a.runs]
        doc = evaluate_seed(table, seed, held, start, out)
        vals = json.loads(doc.read_text())["harnesses"]["native"]["writers"]
        for a in arms:
            a.metrics[seed] = {m: v["value"] for m, v in vals[a.name].items()}
            z = [r[ZERO_ADV] for r in _history(a.runs[seed]) if ZERO_ADV in r]
            a.zero_adv.append(sum(z) / len(z) if z else float("nan"))
        start_row = next((a for a in table if a.name == START), None)
        if start_row is None:
            start_row = Ablation(START, "", [], skip_reason="the RL start, evaluated beside the arms")
            table.append(start_row)
        start_row.metrics[seed] = {m: v["value"] for m, v in vals[START].items()}


def evaluate_seed(table: list[Ablation], seed: int, held: Path, start: Path, out: Path) -> Path:
    """One seed's writer-swap evaluation of every arm with a run for it, beside the bounds and the OPD
    start; its bank metrics' path. Reused while its writers and their runs are unchanged."""
    arms = [a for a in table if seed in a.runs]
    writers = [
        "{name: nothing, kind: empty}",
        "{name: gold, kind: gold}",
        f"{{name: {START}, checkpoint: '{start}'}}",
        *(f"{{name: {a.name}, checkpoint: '{a.runs[seed]}/final'}}" for a in arms),
    ]
    ev = out / "eval" / f"seed{seed}"
    key = json.dumps(
        {
            "writers": writers,
            "data": str(held),
            # evaluations cached under another writer decoding (before it followed the protocol) rerun
            "writer_decoding": "protocol",
            "runs": [
                (a.runs[seed] / "ablation_key.json").read_text()
                if (a.runs[seed] / "ablation_key.json").exists()
                else ""
                for a in arms
            ],
        }
    )
    doc = ev / "eval" / "bank_metrics.json"
    if not (
        doc.exists()
        and (ev / "ablation_eval_key.json").exists()
        and (ev / "ablation_eval_key.json").read_text() == key
    ):
        if ev.exists():
            shutil.rmtree(ev)
        print(f"  evaluation, seed {seed}: {len(arms)} arms + {START} on {held}", flush=True)
        _run(
            [
                "-m",
                "hymem_train.evaluate",
                "+exp=evaluate_demo",
                f"writers=[{', '.join(writers)}]",
                f"data.path={held}",
                f"run.output_dir={ev}",
                f"run.seed={seed}",
                "writer_decoding=protocol",
            ],
            out / "logs" / f"evaluate_seed{seed}.log",
        )
        (ev / "ablation_eval_key.json").write_text(key)
    if not doc.exists():
        raise RuntimeError(f"{ev}: no bank metrics: {held} must be ledger-world data in the native harness")
    return doc


def _history(run_dir: Path) -> list[dict]:
    p = run_dir / "metrics.jsonl"
    if not p.exists():
        return []
    by_step = {}
    for line in p.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_step[row["step"]] = {**by_step.get(row["step"], {}), **row}
    return [by_step[s] for s in sorted(by_step)]


def t_crit(level: float, df: float) -> float:
    """The two-sided critical value of Student's t: P(|T_df| <= t) = level, for any df > 0 (fractional
    for Welch). A normal quantile in its place makes an interval over ten or more seeds too narrow."""
    if not (0.0 < level < 1.0 and df > 0):
        raise ValueError(f"t_crit: level={level} must lie in (0, 1) and df={df} be > 0")
    from scipy.stats import t

    return float(t.ppf((1.0 + level) / 2, df))


def mean_ci(xs: list[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its t-interval at `level` (nan for fewer than 2 values)."""
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, float("nan")
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, t_crit(level, n - 1) * sd / math.sqrt(n)


def diff_ci(xs: list[float], ys: list[float], level: float = 0.95) -> tuple[float, float]:
    """Difference of means (xs - ys) and the half-width of a Welch interval at `level`."""
    (mx, _), (my, _) = mean_ci(xs), mean_ci(ys)
    if len(xs) < 2 or len(ys) < 2:
        return mx - my, float("nan")
    vx = sum((x - mx) ** 2 for x in xs) / (len(xs) - 1) / len(xs)
    vy = sum((y - my) ** 2 for y in ys) / (len(ys) - 1) / len(ys)
    se = math.sqrt(vx + vy)
    if se == 0:
        return mx - my, 0.0
    df = (vx + vy) ** 2 / ((vx**2 / (len(xs) - 1) if vx else 0) + (vy**2 / (len(ys) - 1) if vy else 0))
    return mx - my, t_crit(level, df) * se


def _shift(d: float, h: float) -> str:
    """The observed direction: the sign of an interval that excludes 0, else "0" (a tie)."""
    if math.isnan(h):
        return "?"
    return "+" if d - h > 0 else "-" if d + h < 0 else "0"


@dataclass
class Verdict:
    name: str
    metric: str
    base: float
    arm: float
    diff: float
    half: float  # half-width over seeds at the table's level (nan: fewer than 2 seeds)
    seeds: int
    predicted: str
    observed: str
    held: str  # "yes" | "no" | "n/a"


def verdicts(table: list[Ablation], level: float = 0.95) -> list[Verdict]:
    """Each registered direction checked on its arm's held-out metric: ablation - baseline over seeds,
    paired by seed where the arm shares the baseline's start (a t-interval of the differences), Welch
    where it does not. An "identical by construction" arm holds only when every bank metric of every
    seed equals the baseline's exactly."""
    base = next(a for a in table if a.name == BASELINE)
    out = []
    for a in table:
        p = PREDICTED.get(a.name)
        if p is None or not a.metrics:
            continue
        # a bank metric is None where its data has nothing to count (e.g. no Transition): such a seed
        # carries no evidence either way
        common = [
            s
            for s in sorted(set(a.metrics) & set(base.metrics))
            if a.metrics[s][p.metric] is not None and base.metrics[s][p.metric] is not None
        ]
        xs = [a.metrics[s][p.metric] for s in common]
        ys = [base.metrics[s][p.metric] for s in common]
        if not common:
            continue
        if a.paired:
            d, h = mean_ci([x - y for x, y in zip(xs, ys, strict=True)], level)
        else:
            d, h = diff_ci(xs, ys, level)
        obs = _shift(d, h)
        if p.identical:
            same = all(a.metrics[s] == base.metrics[s] for s in common)
            obs = "identical" if same else obs
            held = "yes" if same else "no"
        elif obs == "?":
            held = "n/a"
        else:
            held = "yes" if obs == p.sign else "no"
        out.append(
            Verdict(
                a.name, p.metric, sum(ys) / len(ys), sum(xs) / len(xs), d, h, len(common), p.sign, obs, held
            )
        )
    return out


def _cell(xs: list[float | None], level: float = 0.95) -> str:
    xs = [x for x in xs if x is not None]  # None: nothing to count in that seed's data
    if not xs:
        return "-"
    m, h = mean_ci(xs, level)
    return f"{m:.3f}" if math.isnan(h) else f"{m:.3f} ± {h:.3f}"


def write_table(
    table: list[Ablation],
    path: Path,
    *,
    steps: int,
    seeds: int,
    wall_s: float | None,
    first_seed: int = 0,
    level: float = 0.95,
) -> str:
    """docs/ablations.md-style markdown (and a PNG beside it): every registered direction checked, then
    every arm on every bank metric (mean ± t half-width over seeds), intervals at `level`."""
    pct = f"{level * 100:g}%"
    runs_min = sum(x for a in table for x in a.seconds if not math.isnan(x)) / 60
    lines = [
        f"{steps} RL steps per run from the same OPD checkpoint, run.seed {first_seed}..{first_seed + seeds - 1}; held-out bank "
        "metrics from one writer-swap evaluation per seed (every arm's final checkpoint and the OPD start "
        "on the same held-out sequences, reader and judge). Differences: ablation - baseline, mean over "
        f"seeds with a {pct} t-interval (paired by seed; Welch for an arm with another start). Observed: the "
        "sign of an interval that excludes 0, else 0."
        + (
            ""
            if wall_s is None
            else f" Wall time of the table: {wall_s / 60:.1f} min (runs: {runs_min:.1f} min; "
            "finished runs and evaluations are reused)."
        ),
        "",
        "| ablation | metric | baseline | ablation | ablation - baseline | seeds | predicted | observed | held |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts(table, level):
        iv = (
            f"{v.diff:+.3f}"
            if math.isnan(v.half)
            else f"{v.diff:+.3f} [{v.diff - v.half:+.3f}, {v.diff + v.half:+.3f}]"
        )
        lines.append(
            f"| {v.name} | {v.metric} | {v.base:.3f} | {v.arm:.3f} | {iv} | {v.seeds} | {v.predicted} | "
            f"{v.observed} | {v.held} |"
        )
    for a in table:
        if a.skip_reason and a.name != START:
            lines.append(f"| {a.name} | - | | | not run ({a.skip_reason}) | | | | |")
    lines += [
        "",
        "| arm | knob | seeds | " + " | ".join(CONTEXT_METRICS) + " | zero-advantage share | run min |",
        "|---|---|---|" + "---|" * (len(CONTEXT_METRICS) + 2),
    ]
    for a in table:
        if not a.metrics:
            continue
        cells = [_cell([a.metrics[s][m] for s in sorted(a.metrics)], level) for m in CONTEXT_METRICS]
        za = _cell([z for z in a.zero_adv if not math.isnan(z)], level)
        mins = [x / 60 for x in a.seconds if not math.isnan(x)]
        run_min = f"{sum(mins) / len(mins):.1f}" if mins else "-"
        row = [a.name, f"`{a.knob or '-'}`", str(len(a.metrics)), *cells, za, run_min]
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    _plot(verdicts(table, level), path.with_suffix(".png"), pct)
    return text


def _plot(vs: list[Verdict], png: Path, pct: str = "95%") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.45 * max(1, len(vs))))
    for i, v in enumerate(vs):
        ax.errorbar([v.diff], [i], xerr=[[0 if math.isnan(v.half) else v.half]], fmt="o", capsize=3)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(vs)), [f"{v.name}: {v.metric} (pred {v.predicted})" for v in vs], fontsize=7)
    ax.set_xlabel(f"ablation - baseline on its registered metric ({pct} CI over seeds)", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


# --- the table as a Slurm job array (slurm/submit_ablations.sh) ---------------------------------------
MANIFEST = "array_tasks.tsv"  # one line per array task: name, seed, run dir, then its overrides (tabs)


def plan_array(
    out: Path,
    *,
    base: str,
    seeds: int,
    only: list[str] | None = None,
    sft_init: str = "",
    identical_seeds: int = 1,
    first_seed: int = 0,
) -> Path:
    """Writes `out/array_tasks.tsv`: every ablation x seed as the overrides of one RL run. With the
    report's recipe as the base (`hy_memory_rl`) a task runs the overlay itself (`+exp=ablation_X`);
    with another base (the tiny `demo_rl`) it applies the overlay's one knob to that base, as the CPU
    table does. Returns the manifest's path; an ablation that cannot run on this base is left out
    with its reason on stderr."""
    rows = []
    for a in discover(Path(".")):  # its init_checkpoint path is the demo's; replaced below
        if only and a.name not in only:
            continue
        if base == "hy_memory_rl":
            exp = ["+exp=hy_memory_rl" if a.name == BASELINE else f"+exp=ablation_{a.name}"]
        elif a.skip_reason or (a.knob == "init_checkpoint" and not sft_init):
            why = a.skip_reason or "pass --sft-init (the generic SFT checkpoint the overlay starts from)"
            print(f"ablation {a.name}: not run on {base}: {why}", file=sys.stderr)
            continue
        else:
            knob = [f"init_checkpoint={sft_init}"] if a.knob == "init_checkpoint" else a.overrides
            exp = [f"+exp={base}", *knob]
        for seed in seeds_of(a.name, seeds, identical_seeds, first_seed):
            run_dir = (out / a.name / f"seed{seed}").resolve()
            over = [
                *exp,
                f"run.seed={seed}",
                f"run.output_dir={run_dir}",
                f"run.name=ablation_{a.name}_seed{seed}",
            ]
            rows.append("\t".join([a.name, str(seed), str(run_dir), *over]))
    if not rows:
        raise ValueError(f"no ablation to run (only={only})")
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).write_text("\n".join(rows) + "\n")
    return out / MANIFEST


def collect_array(out: Path, table_path: Path, *, eval_data: Path, level: float = 0.95) -> str:
    """The table from the array's run directories, evaluated per seed on `eval_data` (a built held-out
    dataset) from the baseline's start. A run that did not finish (failed, cancelled, still running)
    is named and left out, never read as a score."""
    knobs = {a.name: (a.knob, a.paired) for a in discover(Path("."))}
    table: dict[str, Ablation] = {}
    missing: dict[str, list[str]] = {}
    steps, start = set(), None
    for line in (out / MANIFEST).read_text().splitlines():
        name, seed, run_dir = line.split("\t")[:3]
        knob, paired = knobs.get(name, ("?", True))
        a = table.setdefault(name, Ablation(name, knob, [], paired=paired))
        cfg = Path(run_dir) / "config.yaml"
        want = _config_value(cfg, "num_steps") if cfg.exists() else None
        if want is None or not _finished(Path(run_dir), int(want)):
            missing.setdefault(name, []).append(seed)
            continue
        steps.add(int(want))
        a.runs[int(seed)] = Path(run_dir)
        if name == BASELINE:
            start = Path(_config_value(cfg, "init_checkpoint") or "")
    if BASELINE not in table or not table[BASELINE].runs or start is None:
        raise RuntimeError(f"{out}: no finished baseline run; the table is relative to it")
    for name, seeds in missing.items():
        if not table[name].runs:
            table[name].skip_reason = f"no finished run (seeds {', '.join(seeds)})"
    rows = list(table.values())
    evaluate_seeds(rows, eval_data, start, out)
    n_seeds = max((len(a.runs) for a in rows), default=0)
    first = min((s for a in rows for s in a.runs), default=0)
    text = write_table(
        rows,
        table_path,
        steps=max(steps, default=0),
        seeds=n_seeds,
        wall_s=None,
        first_seed=first,
        level=level,
    )
    if missing:
        note = "; ".join(f"{n}: seeds {', '.join(s)}" for n, s in missing.items())
        text += f"\nUnfinished runs, left out: {note}.\n"
        table_path.write_text(text)
    return text


def _config_value(config_yaml: Path, key: str) -> str | None:
    """A top-level scalar of a run's resolved config.yaml."""
    for line in config_yaml.read_text().splitlines():
        if line.startswith(f"{key}:"):
            return line.split(":", 1)[1].strip().strip("'\"")
    return None
