"""Two demo stages that were made parallel without changing what they produce, each against its serial
form in the same run (docs/testbed.md, wall time):

    PYTHONPATH=. python benchmarks/bench_demo_stages.py --sequences 100
    PYTHONPATH=. python benchmarks/bench_demo_stages.py --demo-root runs/demo   # + the evaluation

1. The flawed teacher's demonstrations through the native harness: one process against two, on
   `--sequences` ledger-world sequences; the two files must be equal byte for byte.
2. With `--demo-root` (a finished `make demo`): the writer-swap evaluation of its six writers with 1
   bank build in flight against 8; the bank metrics must be equal (greedy decoding).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.demo_lib.pipeline import (
    DEMO_WRITERS,
    TEACHER_FLAWS,
    build_data,
    demo_harness,
    teacher_demonstrations,
)


def bench_demonstrations(tmp: Path, sequences: int) -> None:
    ds = build_data(tmp / "train", num_sequences=sequences, num_chunks=6, window=3, seed=0, world="ledger")
    secs, files = {}, {}
    for w in (1, 2):
        out = tmp / f"w{w}" / "demos.jsonl"
        t = time.perf_counter()
        teacher_demonstrations(ds, out, demo_harness(), TEACHER_FLAWS, workers=w)
        secs[w], files[w] = time.perf_counter() - t, out.read_bytes()
    if files[1] != files[2]:
        raise SystemExit("the demonstrations differ between one and two processes")
    print(
        f"demonstrations, {sequences} sequences: 1 process {secs[1]:.1f} s, 2 processes {secs[2]:.1f} s, "
        f"ratio {secs[1] / secs[2]:.2f}x (the same file)"
    )


def bench_evaluation(tmp: Path, root: Path) -> None:
    writers = ", ".join(
        ["{name: nothing, kind: empty}", "{name: gold, kind: gold}"]
        + [f"{{name: {n}, checkpoint: '{root}/{d}/final'}}" for n, d in DEMO_WRITERS]
    )
    secs, metrics = {}, {}
    for n in (1, 8):
        out = tmp / f"eval_pb{n}"
        t = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "hymem_train.evaluate",
                "+exp=evaluate_demo",
                f"writers=[{writers}]",
                f"data.path={root}/data/eval/native",
                f"run.output_dir={out}",
                f"parallel_builds={n}",
            ],
            check=True,
            capture_output=True,
        )
        secs[n] = time.perf_counter() - t
        metrics[n] = json.loads((out / "eval" / "bank_metrics.json").read_text())["harnesses"]
    if metrics[1] != metrics[8]:
        raise SystemExit("the bank metrics differ between 1 and 8 builds in flight")
    print(
        f"evaluation, 6 writers: 1 build in flight {secs[1]:.1f} s, 8 builds {secs[8]:.1f} s, "
        f"ratio {secs[1] / secs[8]:.2f}x (the same bank metrics)"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=100)
    ap.add_argument("--demo-root", default="", help="a finished make demo: also time its evaluation")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_demo_"))
    try:
        bench_demonstrations(tmp, args.sequences)
        if args.demo_root:
            bench_evaluation(tmp, Path(args.demo_root).resolve())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
