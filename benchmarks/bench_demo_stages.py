"""Four demo stages that were made parallel without changing what they produce, each against its serial
form in the same run (docs/testbed.md, wall time):

    PYTHONPATH=. python benchmarks/bench_demo_stages.py --sequences 100
    PYTHONPATH=. python benchmarks/bench_demo_stages.py --demo-root runs/demo   # + the evaluation
    PYTHONPATH=. python benchmarks/bench_demo_stages.py --demo-root runs/demo --rl-steps 12 --stages rl
    PYTHONPATH=. python benchmarks/bench_demo_stages.py --demo-root runs/demo --opd-steps 16 --stages opd

1. The flawed teacher's demonstrations through the native harness: one process against two, on
   `--sequences` ledger-world sequences; the two files must be equal byte for byte.
2. With `--demo-root` (a finished `make demo`): the writer-swap evaluation of its six writers on its
   final held-out set with 8 bank builds in flight against 32 (`--builds`); the bank metrics must be
   equal (greedy decoding).
3. With `--rl-steps N` too: RL from the demo's OPD checkpoint (N steps), then the evaluation of every
   writer, against the same RL with the writers that do not wait for it evaluated beside it and only
   RL's banks built after it (`make demo` also reads the bounds, the SFT student and the teacher beside
   OPD); the bank metrics must be equal.
4. With `--opd-steps N` too: OPD from the demo's student (N steps, the held-out evaluation at the first
   and the last, as the demo runs it) with 4 rollout workers against 8 (one per rollout, so the engine
   batches all of a step's rollouts); every step's training metrics must be equal (each rollout's
   sampling is seeded by itself, not by its batch). Use 16 steps or more: 8 Ray actors start once.
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
    _beside,
    _evaluate_args,
    _run,
    build_data,
    demo_harness,
    growth_overrides,
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


def bench_evaluation(tmp: Path, root: Path, builds: tuple[int, ...]) -> None:
    writers = ", ".join(
        ["{name: nothing, kind: empty}", "{name: gold, kind: gold}"]
        + [f"{{name: {n}, checkpoint: '{root}/{d}/final'}}" for n, d in DEMO_WRITERS]
    )
    held = root / "data" / "final_eval" / "native"
    held = held if held.exists() else root / "data" / "eval" / "native"  # a demo from before the final set
    secs, metrics = {}, {}
    for n in builds:
        out = tmp / f"eval_pb{n}"
        t = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "hymem_train.evaluate",
                "+exp=evaluate_demo",
                f"writers=[{writers}]",
                f"data.path={held}",
                f"run.output_dir={out}",
                f"parallel_builds={n}",
            ],
            check=True,
            capture_output=True,
        )
        secs[n] = time.perf_counter() - t
        metrics[n] = json.loads((out / "eval" / "bank_metrics.json").read_text())["harnesses"]
    base = builds[0]
    for n in builds[1:]:
        if metrics[n] != metrics[base]:
            raise SystemExit(f"the bank metrics differ between {base} and {n} builds in flight")
        print(
            f"evaluation, 6 writers, {held.parent.name}: {base} builds in flight {secs[base]:.1f} s, {n} builds "
            f"{secs[n]:.1f} s, ratio {secs[base] / secs[n]:.2f}x (the same bank metrics)"
        )


def bench_rl_overlap(tmp: Path, root: Path, steps: int) -> None:
    held = root / "data" / "eval" / "native"
    growth, _ = growth_overrides(root / "opd")
    secs, metrics = {}, {}
    for mode in ("serial", "beside"):
        run = tmp / mode  # a demo root whose RL is this run's; the other writers are the demo's own
        run.mkdir()
        for _, d in DEMO_WRITERS:
            if d != "rl":
                (run / d).symlink_to(root / d)
        rl = [
            "-m",
            "hymem_train.rl",
            "+exp=demo_rl",
            f"data.path={root}/data/prompts/native",
            f"data.eval_path={held}",
            "run.seed=0",
            f"init_checkpoint={root}/opd/final",
            f"run.output_dir={run}/rl",
            f"num_steps={steps}",
            f"save_every={steps}",
            *growth,
        ]
        t = time.perf_counter()
        if mode == "serial":
            _run(rl, run / "rl.log")
        else:
            _beside(_evaluate_args(run, held, 0, [], skip=("rl",)), run / "early.log", rl, run / "rl.log")
        _run(_evaluate_args(run, held, 0, []), run / "evaluate.log")
        secs[mode] = time.perf_counter() - t
        metrics[mode] = json.loads((run / "swap" / "eval" / "bank_metrics.json").read_text())["harnesses"]
    if metrics["serial"] != metrics["beside"]:
        raise SystemExit("the bank metrics differ with the early writers evaluated beside RL")
    print(
        f"RL ({steps} steps) and the evaluation: one after the other {secs['serial']:.1f} s, the early "
        f"writers beside RL {secs['beside']:.1f} s, ratio {secs['serial'] / secs['beside']:.2f}x "
        "(the same bank metrics)"
    )


def bench_opd_workers(tmp: Path, root: Path, steps: int) -> None:
    secs, metrics, step_secs = {}, {}, {}
    for workers in (4, 8):
        out = tmp / f"opd_w{workers}"
        t = time.perf_counter()
        _run(
            [
                "-m",
                "hymem_train.opd",
                "+exp=demo_opd",
                f"data.path={root}/data/prompts/native",
                f"data.eval_path={root}/data/eval/native",
                "run.seed=0",
                f"teacher.path={root}/sft/final",
                f"init_checkpoint={root}/student_init/final",
                f"run.output_dir={out}",
                f"num_steps={steps}",
                f"save_every={steps}",
                f"rollout.num_workers={workers}",
                # one rollout per actor, as this comparison was made (the demo now runs 2 actors x 4:
                # benchmarks/bench_rollout_actors.py compares actor counts)
                "rollout.rollouts_per_worker=1",
                "rollout.num_cpus_per_worker=0.25",
                "logging.wandb_mode=disabled",
            ],
            tmp / f"opd_w{workers}.log",
        )
        secs[workers] = time.perf_counter() - t
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
        metrics[workers] = [
            {k: v for k, v in r.items() if k.startswith(("train/", "distill/"))} for r in rows
        ]
        step_secs[workers] = sum(r["perf/time_step_s"] for r in rows if "perf/time_step_s" in r)
    if metrics[4] != metrics[8]:
        raise SystemExit("the OPD training metrics differ between 4 and 8 rollout workers")
    # the steps alone, and the whole run: 8 workers start 8 Ray actors, a cost paid once per run
    print(
        f"OPD ({steps} steps, held-out evaluation at 0 and {steps}): steps 4 rollout workers {step_secs[4]:.1f} s, 8 workers "
        f"{step_secs[8]:.1f} s, ratio {step_secs[4] / step_secs[8]:.2f}x; whole run {secs[4]:.1f} s against "
        f"{secs[8]:.1f} s, ratio {secs[4] / secs[8]:.2f}x (the same training metrics at every step)"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=100)
    ap.add_argument("--demo-root", default="", help="a finished make demo: also time its evaluation")
    ap.add_argument("--rl-steps", type=int, default=0, help="with --demo-root: also time RL + evaluation")
    ap.add_argument(
        "--opd-steps", type=int, default=0, help="with --demo-root: also time OPD's rollout workers"
    )
    ap.add_argument(
        "--builds", default="8,32", help="bank builds in flight to compare, the first the baseline"
    )
    ap.add_argument("--stages", default="demonstrations,evaluation,rl,opd", help="which of the four to run")
    args = ap.parse_args()
    if len(args.builds.split(",")) < 2:
        ap.error(f"--builds {args.builds}: want at least two counts, the first the baseline")
    tmp = Path(tempfile.mkdtemp(prefix="bench_demo_"))
    try:
        stages = args.stages.split(",")
        if "demonstrations" in stages:
            bench_demonstrations(tmp, args.sequences)
        if args.demo_root and "evaluation" in stages:
            bench_evaluation(tmp, Path(args.demo_root).resolve(), tuple(map(int, args.builds.split(","))))
        if args.demo_root and args.rl_steps and "rl" in stages:
            bench_rl_overlap(tmp, Path(args.demo_root).resolve(), args.rl_steps)
        if args.demo_root and args.opd_steps and "opd" in stages:
            bench_opd_workers(tmp, Path(args.demo_root).resolve(), args.opd_steps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
