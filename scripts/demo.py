"""`make demo`: the main job on the embedded default (tiny models, 2 CPU cores).

    .venv/bin/python scripts/demo.py                 # data -> SFT teacher -> OPD -> RL -> runs/demo/report.md
    .venv/bin/python scripts/demo.py --gateway-only  # the foundation demo: gateway + recorded segments
    .venv/bin/python scripts/demo.py --root runs/demo2

The logic lives in hymem_train/demo_pipeline.py and hymem_train/demo.py.
"""

import argparse
import logging
import shutil

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateway-only", action="store_true")
    ap.add_argument("--root", default="runs/demo")
    args = ap.parse_args()
    if args.gateway_only:
        from hymem_train.demo import run_gateway_demo

        run_gateway_demo()
    else:
        from hymem_train.demo_pipeline import run_demo

        shutil.rmtree(args.root, ignore_errors=True)  # every `make demo` starts from a clean slate
        run_demo(args.root)
