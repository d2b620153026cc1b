"""`make ablations`: the ablation table at tiny scale on CPU, from `make demo`'s OPD checkpoint.

    .venv/bin/python scripts/ablations.py                       # 3 seeds x 24 RL steps (the demo's RL length)
    .venv/bin/python scripts/ablations.py --only baseline no_traps --seeds 2 --jobs 2
    .venv/bin/python scripts/ablations.py --only baseline no_traps --seeds 16 --first-seed 10   # fresh seeds

Writes runs/ablations/ (one run directory per ablation and seed, and one writer-swap evaluation per
seed under eval/; finished runs and evaluations are reused) and the table to runs/ablations/table.md +
table.png (`--table` elsewhere; docs/ablations.md holds the measured tables with what they mean). Each
registered direction (docs/ablation_predictions.md) is checked on its own held-out bank metric. The
logic lives in scripts/demo_lib/ablations.py.

On a cluster, slurm/submit_ablations.sh runs the same table as a job array, through two more modes:

    scripts/ablations.py --plan-array --out DIR --base hy_memory_rl --seeds 3   # DIR/array_tasks.tsv
    scripts/ablations.py --collect --out DIR --eval-data HELD_OUT               # DIR/table.md from the runs
"""

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: scripts.demo_lib

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--demo-root", default="runs/demo", help="a finished `make demo` (its OPD checkpoint and data)"
    )
    ap.add_argument("--out", default="runs/ablations")
    ap.add_argument("--table", default="", help="the table's markdown (default: <out>/table.md)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="run.seed of the first seed (a design read on fresh seeds starts past those already run)",
    )
    ap.add_argument(
        "--identical-seeds",
        type=int,
        default=1,
        help="seeds for the arms registered identical to the baseline by construction (one shows it)",
    )
    ap.add_argument(
        "--level",
        type=float,
        default=0.95,
        help="the intervals' level (a design read as a second test of a direction uses a stricter one)",
    )
    ap.add_argument("--steps", type=int, default=24, help="RL steps per run (the demo's RL: 24)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=2,
        # two saturate 2 cores (their Ray actors included); three were no faster (docs/performance.md)
        help="RL runs at a time, each with cores/jobs torch threads",
    )
    ap.add_argument("--only", nargs="*", help="ablation names (baseline, no_traps, ...)")
    ap.add_argument("--plan-array", action="store_true", help="write the job array's tasks (slurm/)")
    ap.add_argument("--collect", action="store_true", help="the table from a job array's runs (slurm/)")
    ap.add_argument("--eval-data", default="", help="--collect: the built held-out dataset to evaluate on")
    ap.add_argument("--base", default="hy_memory_rl", help="--plan-array: the experiment the knobs apply to")
    ap.add_argument("--sft-init", default="", help="--plan-array: the generic SFT checkpoint (sft_init)")
    args = ap.parse_args()
    from scripts.demo_lib.ablations import collect_array, plan_array, run_table, write_table

    arms = {
        "seeds": args.seeds,
        "only": args.only,
        "identical_seeds": args.identical_seeds,
        "first_seed": args.first_seed,
    }
    if args.plan_array:
        path = plan_array(Path(args.out), base=args.base, sft_init=args.sft_init, **arms)
        print(len(path.read_text().splitlines()))  # the array's size, for the submit script
        sys.exit(0)
    if args.collect:
        if not args.eval_data:
            ap.error("--collect needs --eval-data (the built held-out dataset every arm is evaluated on)")
        print(
            collect_array(
                Path(args.out), Path(args.out) / "table.md", eval_data=Path(args.eval_data), level=args.level
            )
        )
        sys.exit(0)

    t0 = time.perf_counter()
    table = run_table(Path(args.demo_root), Path(args.out), steps=args.steps, jobs=args.jobs, **arms)
    print(
        write_table(
            table,
            Path(args.table or Path(args.out) / "table.md"),
            steps=args.steps,
            seeds=args.seeds,
            wall_s=time.perf_counter() - t0,
            first_seed=args.first_seed,
            level=args.level,
        )
    )
