"""`make demo`: the main job on the embedded default (tiny models, 2 CPU cores).

    .venv/bin/python scripts/demo.py                 # data -> SFT teacher -> OPD -> RL -> runs/demo/report.md
    .venv/bin/python scripts/demo.py --gateway-only  # the foundation demo: gateway + recorded segments
    .venv/bin/python scripts/demo.py --root runs/demo_s1 --data-seed 1 --run-seed 1   # another seed pair
    .venv/bin/python scripts/demo.py --reevaluate --root runs/demo   # a finished demo's evaluation again

The logic lives in scripts/demo_lib/pipeline.py and scripts/demo_lib/gateway.py (demo code, kept out
of the hymem_train package).
"""

import argparse
import logging
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: scripts.demo_lib

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateway-only", action="store_true")
    ap.add_argument("--root", default="runs/demo")
    ap.add_argument(
        "--reevaluate",
        action="store_true",
        help="a finished demo: run its evaluation and report again, nothing retrained",
    )
    ap.add_argument("--data-seed", type=int, default=0, help="draws the data and the pretraining corpus")
    ap.add_argument(
        "--run-seed", type=int, default=0, help="seeds every training run (a seed pair with --data-seed)"
    )
    ap.add_argument(
        "--pretrain-session-share",
        type=float,
        default=0.0,
        help="share of pretraining copy episodes laid out as the writer's prompt (data_pipeline/ledger.py)",
    )
    ap.add_argument(
        "--teacher-pretrain-mix",
        type=int,
        default=2000,
        help="copy documents mixed into the SFT that makes the student and the teacher (docs/testbed.md)",
    )
    ap.add_argument(
        "--student-epochs",
        type=int,
        default=2,
        help="the student is the SFT run stopped after this many of the teacher's 4 epochs",
    )
    ap.add_argument(
        "--train-sequences",
        type=int,
        default=500,
        help="ledger sequences the flawed teacher's demonstrations are written from (6 chunks each)",
    )
    ap.add_argument(
        "--rl-steps",
        type=int,
        default=None,
        help="RL's step count (default: configs/exp/demo_rl.yaml's num_steps)",
    )
    args = ap.parse_args()
    if args.gateway_only:
        from scripts.demo_lib.gateway import run_gateway_demo

        run_gateway_demo()
    elif args.reevaluate:
        from scripts.demo_lib.pipeline import reevaluate

        reevaluate(args.root)
    else:
        from scripts.demo_lib.pipeline import run_demo

        shutil.rmtree(args.root, ignore_errors=True)  # every `make demo` starts from a clean slate
        run_demo(
            args.root,
            data_seed=args.data_seed,
            run_seed=args.run_seed,
            pretrain_session_share=args.pretrain_session_share,
            teacher_pretrain_mix=args.teacher_pretrain_mix,
            student_epochs=args.student_epochs,
            num_train_sequences=args.train_sequences,
            rl_steps=args.rl_steps,
        )
