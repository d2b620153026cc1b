"""Per-step breakdown of a training run: seconds and share per phase, and what each phase moved
(LLM calls and tokens through the gateway, engine batch occupancy, reader / judge calls, trained
tokens, weight-sync MiB), with mean rows. Reads `<run>/metrics.jsonl`; the logic lives in
hymem_train/callbacks/step_profile.py (docs/performance.md, "RL step profile").

    .venv/bin/python scripts/step_breakdown.py runs/demo/rl runs/demo/opd
    .venv/bin/python scripts/step_breakdown.py --mean-only runs/ablations/baseline/seed0
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: hymem_train

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run directory holding metrics.jsonl")
    ap.add_argument("--mean-only", action="store_true", help="print only the mean rows")
    args = ap.parse_args()
    from hymem_train.callbacks.step_profile import profile_run

    for d in args.run_dirs:
        print(f"## {d}\n")
        print(profile_run(d, per_step=not args.mean_only))
