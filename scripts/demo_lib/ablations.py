"""The ablation table at tiny scale on CPU: every `configs/exp/ablation_*.yaml` x N seeds, each an RL
run from the same OPD checkpoint of `make demo`, against the baseline (the demo's RL recipe).

Each overlay changes one knob of the full-size `hy_memory_rl` (tests/config/test_configs.py checks
it); here that one knob is read off the typed configs (`config_diff`) and applied to the tiny RL
recipe (`+exp=demo_rl`). Path-valued knobs get their tiny-scale counterpart (`init_checkpoint`: the
demo's SFT student, the checkpoint OPD started from); a knob with no tiny-scale counterpart is shown
as "not run" with the reason. Seeds: `run.seed` (it reaches every seed of the stage). Runs that
finished are reused, so an interrupted table resumes.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

METRIC = "eval/s"  # held-out mean per-chunk score s[t] (the RL stage's own held-out evaluation)
# Bumped when the held-out metric's meaning changes, so an old run is re-run rather than reused.
# v2: held-out banks scored with the report's reward protocol (ScoringConfig.report_protocol), not
# each run's own (ablated) reward config.
METRIC_VERSION = "v2"
BASELINE = "baseline"
# t quantiles (two-sided 95%) for small samples; a normal quantile beyond
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


@dataclass
class Ablation:
    name: str
    knob: str  # the dotted key the overlay changes ("" for the baseline)
    overrides: list[str]  # the knob at tiny scale, as Hydra overrides
    skip_reason: str = ""  # non-empty: not run at tiny scale, and why
    finals: list[float] = field(default_factory=list)  # METRIC at the last step, one per seed
    starts: list[float] = field(default_factory=list)  # METRIC at step 0, one per seed
    seconds: list[float] = field(default_factory=list)


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
            out.append(Ablation(name, knob, [f"init_checkpoint={root}/student_init/final"]))
        elif knob == "harnesses":
            out.append(Ablation(name, knob, [], skip_reason="the tiny recipe trains in one harness (native)"))
        else:
            # ++: the knob may be absent from the YAML (a schema default), where a plain override fails
            out.append(Ablation(name, knob, [f"++{knob}={_fmt(value)}"]))
    return out


def run_table(
    root: Path,
    out: Path,
    *,
    seeds: int = 3,
    steps: int = 2,
    eval_rollouts: int = 1,
    only: list[str] | None = None,
    extra: list[str] | None = None,
) -> list[Ablation]:
    """Every ablation x seed as a real `python -m hymem_train.rl` run (reused when already finished)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from scripts.demo_lib.pipeline import growth_overrides

    for need in (root / "opd" / "final", root / "sft" / "final", root / "data" / "prompts" / "native"):
        if not need.exists():
            raise FileNotFoundError(
                f"{need} is missing: run `make demo` first (the ablations start from its OPD)"
            )
    growth, _ = growth_overrides(root / "opd")
    table = [a for a in discover(root) if not only or a.name in only]
    for a in table:
        if a.skip_reason:
            continue
        for seed in range(seeds):
            run_dir = out / a.name / f"seed{seed}"
            cmd = [sys.executable, "-m", "hymem_train.rl", "+exp=demo_rl",
                   f"data.path={root}/data/prompts/native", f"data.eval_path={root}/data/eval/native",
                   f"init_checkpoint={root}/opd/final", f"reader_model.path={root}/sft/final",
                   f"run.output_dir={run_dir}", f"run.name=ablation_{a.name}_seed{seed}", f"run.seed={seed}",
                   f"num_steps={steps}", f"save_every={steps}", f"rl.num_eval_rollouts={eval_rollouts}",
                   "logging.wandb_mode=disabled", *growth, *a.overrides, *(extra or [])]  # fmt: skip
            key = json.dumps({"metric_version": METRIC_VERSION, "cmd": cmd[1:]})
            rows = _history(run_dir)
            stamp = run_dir / "ablation_key.json"
            fresh = stamp.exists() and stamp.read_text() == key
            if not (fresh and rows and rows[-1]["step"] == steps and METRIC in rows[-1]):
                if run_dir.exists():  # another command or metric version: it would resume, not restart
                    shutil.rmtree(run_dir)
                t0 = time.perf_counter()
                print(f"  {a.name} seed {seed}: {' '.join(a.overrides) or '(the demo recipe)'}", flush=True)
                log = out / "logs" / f"{a.name}_seed{seed}.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                with log.open("w") as f:
                    r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
                if r.returncode != 0:
                    raise RuntimeError(
                        f"ablation {a.name} seed {seed} failed (exit {r.returncode}); see {log}"
                    )
                (run_dir / "wall_seconds").write_text(f"{time.perf_counter() - t0:.1f}")
                stamp.write_text(key)
                rows = _history(run_dir)
            a.starts.append(next(r[METRIC] for r in rows if r["step"] == 0))
            a.finals.append(rows[-1][METRIC])
            wall = run_dir / "wall_seconds"
            a.seconds.append(float(wall.read_text()) if wall.exists() else float("nan"))
    return table


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


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (nan for fewer than 2 values)."""
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, float("nan")
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, T95.get(n - 1, 1.96) * sd / math.sqrt(n)


def diff_ci(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Difference of means (xs - ys) and the half-width of a Welch 95% interval."""
    (mx, _), (my, _) = mean_ci(xs), mean_ci(ys)
    if len(xs) < 2 or len(ys) < 2:
        return mx - my, float("nan")
    vx = sum((x - mx) ** 2 for x in xs) / (len(xs) - 1) / len(xs)
    vy = sum((y - my) ** 2 for y in ys) / (len(ys) - 1) / len(ys)
    se = math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / ((vx**2 / (len(xs) - 1) if vx else 0) + (vy**2 / (len(ys) - 1) if vy else 0) or 1)
    return mx - my, T95.get(max(1, math.floor(df)), 1.96) * se


def write_table(table: list[Ablation], path: Path, *, steps: int, seeds: int, wall_s: float | None) -> str:
    """docs/ablations.md-style markdown (and a PNG beside it): mean +- 95% CI per ablation and the
    difference to the baseline; an interval that covers 0 is a tie."""
    base = next((a for a in table if a.name == BASELINE), None)
    lines = [
        f"Held-out mean per-chunk score `{METRIC}` after {steps} RL steps, {seeds} seed(s) each "
        f"(run.seed 0..{seeds - 1}), every run from the same OPD checkpoint; 95% t-intervals (Welch for the "
        f"difference)."
        + (
            ""
            if wall_s is None
            else f" Wall time of the table: {wall_s / 60:.1f} min (the runs themselves: "
            f"{sum(x for a in table for x in a.seconds if not math.isnan(x)) / 60:.1f} min; a finished run is reused)."
        ),
        "",
        "| ablation | knob | step 0 | final | final - baseline |",
        "|---|---|---|---|---|",
    ]
    for a in table:
        if a.skip_reason:
            lines.append(f"| {a.name} | `{a.knob}` | not run | not run ({a.skip_reason}) | |")
            continue
        s0, (m, h) = mean_ci(a.starts)[0], mean_ci(a.finals)
        d = (
            ""
            if a is base or base is None or not base.finals
            else "{:+.3f} ± {:.3f}".format(*diff_ci(a.finals, base.finals))
        )
        lines.append(f"| {a.name} | `{a.knob or '-'}` | {s0:.3f} | {m:.3f} ± {h:.3f} | {d} |")
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    _plot(table, path.with_suffix(".png"))
    return text


def _plot(table: list[Ablation], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [a for a in table if a.finals]
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(ran)))
    for i, a in enumerate(ran):
        m, h = mean_ci(a.finals)
        ax.errorbar([m], [i], xerr=[[0 if math.isnan(h) else h]], fmt="o", capsize=3)
        ax.scatter(a.finals, [i] * len(a.finals), s=8, alpha=0.5)
    ax.set_yticks(range(len(ran)), [a.name for a in ran], fontsize=8)
    ax.set_xlabel(f"held-out {METRIC} (mean, 95% CI; dots: seeds)", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


# --- the table as a Slurm job array (slurm/submit_ablations.sh) ---------------------------------------
MANIFEST = "array_tasks.tsv"  # one line per array task: name, seed, run dir, then its overrides (tabs)


def plan_array(
    out: Path, *, base: str, seeds: int, only: list[str] | None = None, sft_init: str = ""
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
        for seed in range(seeds):
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


def collect_array(out: Path, table_path: Path) -> str:
    """The table from the array's run directories. A run that did not finish (failed, cancelled, still
    running) is counted and left out of its row's mean, never read as a score."""
    knobs = {a.name: a.knob for a in discover(Path("."))}
    table: dict[str, Ablation] = {}
    missing: dict[str, list[str]] = {}
    steps = set()
    for line in (out / MANIFEST).read_text().splitlines():
        name, seed, run_dir = line.split("\t")[:3]
        a = table.setdefault(name, Ablation(name, knobs.get(name, "?"), []))
        rows = [r for r in _history(Path(run_dir)) if METRIC in r]
        cfg = Path(run_dir) / "config.yaml"
        want = _num_steps(cfg) if cfg.exists() else None
        if not rows or want is None or rows[-1]["step"] != want or rows[0]["step"] != 0:
            missing.setdefault(name, []).append(seed)
            continue
        steps.add(want)
        a.starts.append(rows[0][METRIC])
        a.finals.append(rows[-1][METRIC])
    for name, seeds in missing.items():
        if not table[name].finals:
            table[name].skip_reason = f"no finished run (seeds {', '.join(seeds)})"
    n_seeds = max((len(a.finals) for a in table.values()), default=0)
    text = write_table(
        list(table.values()), table_path, steps=max(steps, default=0), seeds=n_seeds, wall_s=None
    )
    if missing:
        note = "; ".join(f"{n}: seeds {', '.join(s)}" for n, s in missing.items())
        text += f"\nUnfinished runs, left out of the means: {note}.\n"
        table_path.write_text(text)
    return text


def _num_steps(config_yaml: Path) -> int | None:
    for line in config_yaml.read_text().splitlines():
        if line.startswith("num_steps:"):
            return int(line.split(":", 1)[1])
    return None
