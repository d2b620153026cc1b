"""RL step wall time, synchronous vs overlapped rollout (`rl.overlap_rollout`), on the CPU demo settings.

    .venv/bin/python benchmarks/bench_overlap_rollout.py [--steps 8] [--root runs/demo] [--out runs/bench_overlap]

Needs `make demo` first: both runs start from its OPD student (`<root>/opd/final`), read with its SFT
teacher as the frozen reader, train on its data with the growth bounds calibrated from its OPD run,
exactly as the demo's RL stage does, for `--steps` steps. They differ only in `rl.overlap_rollout`, and
run one after the other, so neither shares the two cores with the other.

Prints, for each mode: the mean wall seconds per step over steps 2..N-1 (step 1 collects on its own
clock in both modes, step N evaluates), the phases' seconds, the measured policy lag, the held-out
reward (eval/s) at step 0 (the same weights: a check that both start alike) and at step N; then the
wall-time ratio synchronous / overlapped. The held-out score is there so a speed-up is not bought with
learning; on 288 scored cells its step-to-step noise is about +-0.02 (docs/performance.md).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.demo_lib.pipeline import growth_overrides

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PHASES = ("rollout", "reward", "train", "sync")


def run_mode(root: Path, out: Path, steps: int, overlap: bool) -> tuple[dict[int, dict], float]:
    growth, _ = growth_overrides(root / "opd")
    cmd = [
        sys.executable,
        "-m",
        "hymem_train.rl",
        "+exp=demo_rl",
        f"data.path={root}/data/prompts/native",
        f"data.eval_path={root}/data/eval/native",
        f"init_checkpoint={root}/opd/final",
        f"reader_model.path={root}/sft/final",
        f"run.output_dir={out}",
        f"num_steps={steps}",
        f"save_every={steps}",
        "logging.wandb_mode=disabled",
        f"rl.overlap_rollout={str(overlap).lower()}",
        *growth,
    ]
    if out.exists():
        raise SystemExit(f"{out} exists: remove it or pass another --out (a resumed run would not be timed)")
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with (out.parent / f"{out.name}.log").open("w") as log:
        subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r for r in rows}, time.perf_counter() - t0


def summary(m: dict[int, dict], steps: int) -> dict[str, float]:
    timed = [m[s] for s in range(2, steps)]
    out = {"wall_s": statistics.mean(r["perf/time_wall_s"] for r in timed)}
    for p in PHASES:
        out[p] = statistics.mean(r.get(f"perf/time_{p}_s", 0.0) for r in timed)
    out["hidden_s"] = statistics.mean(r.get("overlap/hidden_s", 0.0) for r in timed)
    out["lag"] = statistics.mean(r["rollout/policy_lag_mean"] for r in timed)
    out["eval0"], out["evalN"] = m[0]["eval/s"], m[steps]["eval/s"]
    out["train_reward"] = statistics.mean(m[s]["reward/s"] for s in range(1, steps + 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--root", default="runs/demo", help="a finished `make demo` run")
    ap.add_argument("--out", default="runs/bench_overlap")
    args = ap.parse_args()
    if args.steps < 3:
        raise SystemExit("--steps must be >= 3 (step 1 and the evaluating last step are not timed)")
    root, out = (REPO / args.root).resolve(), (REPO / args.out).resolve()
    if not (root / "opd" / "final" / "config.json").exists():
        raise SystemExit(f"{root}/opd/final not found: run `make demo` first (or pass --root)")
    res = {}
    for name, overlap in (("synchronous", False), ("overlapped", True)):
        m, total = run_mode(root, out / name, args.steps, overlap)
        res[name] = summary(m, args.steps)
        res[name]["total_s"] = total
    head = "| mode | wall s/step | " + " | ".join(f"{p} s" for p in PHASES) + " | hidden s | policy lag |"
    head += " eval/s step 0 | eval/s step N | train reward/s | run s |"
    print(head + "\n|" + "---|" * (head.count("|") - 1))
    for name, r in res.items():
        print(
            f"| {name} | {r['wall_s']:.2f} | "
            + " | ".join(f"{r[p]:.2f}" for p in PHASES)
            + f" | {r['hidden_s']:.2f} | {r['lag']:.2f} | {r['eval0']:.3f} | {r['evalN']:.3f} |"
            f" {r['train_reward']:.3f} | {r['total_s']:.0f} |"
        )
    s, o = res["synchronous"], res["overlapped"]
    print(
        f"\nsteps 2..{args.steps - 1}: overlapped is {s['wall_s'] / o['wall_s']:.2f}x faster per step "
        f"(synchronous {s['wall_s']:.2f} s / overlapped {o['wall_s']:.2f} s); held-out eval/s after "
        f"{args.steps} steps: synchronous {s['evalN']:.3f}, overlapped {o['evalN']:.3f}"
    )


if __name__ == "__main__":
    main()
