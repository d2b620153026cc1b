"""Start-up of a rollout actor's import path, measured in one run against what it loaded before.

    .venv/bin/python benchmarks/bench_actor_import.py [--repeats 8]

Every Ray rollout actor (`rollout.num_workers` per RL run: 16 in the CPU recipe when this was measured,
4 now) imports `hymem_train.rollout.worker`. That path used to load
`datasets` (with pandas and pyarrow) for the HF Features of the stored tables, which now live in
data_pipeline/store.py. This times `--repeats` fresh interpreters importing the worker's module as it is
now, against the same with `datasets` imported first (what the path loaded before), alternating the two,
and prints the CPU seconds (user + system) per import of each and their ratio. CPU, not wall time: on a
shared 2-core box the actors start while the other runs compute, so their CPU is what they take away.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOW = "import hymem_train.rollout.worker"
BEFORE = "import datasets, hymem_train.rollout.worker"  # the module path as it was, datasets included


def cpu_seconds(code: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=8)
    args = ap.parse_args()
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            NOW
            + "; import sys; print(sorted({'datasets', 'pandas', 'pyarrow', 'torch'} & set(sys.modules)))",
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"heavy packages the worker's import loads now: {loaded}")
    cpu_seconds(NOW)  # warm the page cache and the bytecode of both paths before timing
    cpu_seconds(BEFORE)
    now, before = [], []
    for _ in range(args.repeats):
        now.append(cpu_seconds(NOW))
        before.append(cpu_seconds(BEFORE))
    m_now, m_before = statistics.median(now), statistics.median(before)
    print(
        f"CPU s per import, median of {args.repeats}: with datasets (before) {m_before:.2f}, now {m_now:.2f}"
    )
    print(
        f"ratio before / now: {m_before / m_now:.2f}x; per 16 actors: {16 * (m_before - m_now):.1f} CPU s less"
    )


if __name__ == "__main__":
    main()
