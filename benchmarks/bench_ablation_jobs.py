"""The ablation table's RL runs two at a time against three at a time, measured in one run.

    .venv/bin/python benchmarks/bench_ablation_jobs.py [--demo-root runs/demo] [--runs 3] [--steps 6]

Needs a finished `make demo`. Runs the baseline arm `--runs` times (run.seed 0..runs-1) through
`scripts.demo_lib.ablations.run_table`, the scheduling `make ablations` uses, without the evaluation:
first `--jobs-a` runs at a time, then `--jobs-b`, each into a fresh directory. Every run gets one torch
thread either way on 2 cores (cores // jobs, at least 1); the script compares each seed's reward, loss
and gradient norm step for step (printing the first difference of each), then both wall times and their
ratio. It asks whether a third run finds idle CPU beside two (each run's Ray actors are CPU too, which
the driver's `/usr/bin/time` does not count). Numbers seen on the 2-core box: docs/performance.md, "The
ablation table on two cores".
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.demo_lib.ablations import BASELINE, run_table  # noqa: E402

COMPARED = ("reward/s", "train/loss", "train/grad_norm")


def trace(run_dir: Path) -> list[tuple]:
    """(step, reward, loss, gradient norm) per step, to compare between the two settings."""
    by_step: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_step.setdefault(row["step"], {}).update(row)
    return [(s, *(by_step[s].get(k) for k in COMPARED)) for s in sorted(by_step)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo-root", default="runs/demo")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--jobs-a", type=int, default=2)
    ap.add_argument("--jobs-b", type=int, default=3)
    ap.add_argument("--keep", default="", help="keep the runs here (default: a temporary directory)")
    args = ap.parse_args()
    root = Path(args.demo_root)
    walls, traces = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench_ablation_jobs_") as tmp:
        tmp = args.keep or tmp
        for jobs in (args.jobs_a, args.jobs_b):
            t0 = time.perf_counter()
            table = run_table(
                root,
                Path(tmp) / f"jobs{jobs}",
                seeds=args.runs,
                steps=args.steps,
                only=[BASELINE],
                jobs=jobs,
                evaluate=False,
            )
            walls[jobs] = time.perf_counter() - t0
            [base] = table
            traces[jobs] = {seed: trace(d) for seed, d in base.runs.items()}
            print(f"jobs {jobs}: {args.runs} runs x {args.steps} steps in {walls[jobs]:.1f} s", flush=True)
    a, b = traces[args.jobs_a], traces[args.jobs_b]
    same = True
    for seed in sorted(a):
        for i, key in enumerate(COMPARED, start=1):
            diffs = [(ra[0], ra[i], rb[i]) for ra, rb in zip(a[seed], b[seed], strict=True) if ra[i] != rb[i]]
            if diffs:
                same = False
                step, x, y = diffs[0]
                worst = max(abs(x - y) for _, x, y in diffs)
                print(
                    f"seed {seed} {key}: {len(diffs)} of {len(a[seed])} steps differ, first at step {step} "
                    f"({x!r} vs {y!r}), largest |difference| {worst:.3g}"
                )
    if same:
        print(
            f"every seed's {', '.join(COMPARED)} equal step for step ({args.runs} seeds x {args.steps} steps)"
        )
    print(
        f"wall time, {args.jobs_a} at a time / {args.jobs_b} at a time: "
        f"{walls[args.jobs_a]:.1f} / {walls[args.jobs_b]:.1f} s = {walls[args.jobs_a] / walls[args.jobs_b]:.2f}x"
    )


if __name__ == "__main__":
    main()
