"""An RL run's rollouts on 16 one-rollout Ray actors (the CPU recipe) against fewer actors running several
rollouts each, measured in one run.

    .venv/bin/python benchmarks/bench_rollout_actors.py [--demo-root runs/demo] [--steps 24] [--actors 4]

Needs a finished `make demo` and a quiet box. Runs the ablation table's baseline (the demo's RL recipe from
its OPD checkpoint, run.seed 0, one torch thread, through `scripts.demo_lib.ablations.run_table`) twice,
one after the other: `rollout.num_workers=16` (one rollout each), then `--actors` workers with
16 / `--actors` rollouts each (`rollout.rollouts_per_worker`, Ray's max_concurrency), the same 16 in
flight and the same CPU reservation in all. Prints each run's wall time and the machine's busy CPU seconds
over it (from /proc/stat, so the Ray actors count), their ratios, and whether the two runs' rewards are
equal step for step: each rollout's sampling is seeded by itself, and the engine batches what is in
flight either way.
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

IN_FLIGHT, CPUS = 16, 16 * 0.09  # the demo recipe's rollout workers and their Ray CPU reservation


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (every process: the Ray actors too)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def rewards(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["step"], r["reward/s"]) for r in rows if "reward/s" in r]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo-root", default="runs/demo")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--actors", type=int, default=4, help="workers of the second run (16 must divide by it)")
    args = ap.parse_args()
    if IN_FLIGHT % args.actors:
        ap.error(f"--actors {args.actors}: {IN_FLIGHT} rollouts in flight must split evenly")
    per = IN_FLIGHT // args.actors
    settings = {
        f"{IN_FLIGHT} actors x 1": [f"rollout.num_workers={IN_FLIGHT}", "rollout.rollouts_per_worker=1"],
        f"{args.actors} actors x {per}": [
            f"rollout.num_workers={args.actors}",
            f"rollout.rollouts_per_worker={per}",
            f"rollout.num_cpus_per_worker={CPUS / args.actors:g}",
        ],
    }
    got = {}
    with tempfile.TemporaryDirectory(prefix="bench_rollout_actors_") as tmp:
        for name, extra in settings.items():
            t0, c0 = time.perf_counter(), busy_seconds()
            # jobs=2 with one run: one torch thread, as every run of the ablation table gets
            [base] = run_table(
                Path(args.demo_root),
                Path(tmp) / name.replace(" ", "_"),
                seeds=1,
                steps=args.steps,
                only=[BASELINE],
                extra=extra,
                jobs=2,
                evaluate=False,
            )
            wall, cpu = time.perf_counter() - t0, busy_seconds() - c0
            got[name] = (wall, cpu, rewards(base.runs[0]))
            print(f"{name}: {wall:.1f} s wall, {cpu:.1f} busy CPU s ({args.steps} steps)", flush=True)
    (a, (wa, ca, ra)), (b, (wb, cb, rb)) = got.items()
    same = ra == rb
    print(
        f"rewards equal at every step: {same}"
        + ("" if same else f" (first: {next(x for x in zip(ra, rb, strict=False) if x[0] != x[1])})")
    )
    print(f"{a} / {b}: wall {wa / wb:.2f}x, busy CPU {ca / cb:.2f}x")


if __name__ == "__main__":
    main()
