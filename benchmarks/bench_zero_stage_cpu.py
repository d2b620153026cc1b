"""Trainer step time on one CPU rank: ZeRO-3 (the report's setting) vs ZeRO off (what the CPU demo uses).

    .venv/bin/python benchmarks/bench_zero_stage_cpu.py [--steps 30] [--segments 16] [--preset tiny_teacher]

On a single rank ZeRO-3 partitions nothing, yet its per-module gather/release hooks still run on every
forward and backward; for the demo's tiny models that overhead dominates the step. Both trainers
are built from the same initial weights (each in its own child process: DeepSpeed keeps one process
group per process) and train on the same packed SFT batches
(plain-LM rows of the demo's pretraining stand-in); prints the mean step seconds of each (first 3
steps skipped as warm-up), the final losses (equal up to float noise: the same optimisation), and
the ratio. Numbers seen on the 2-core dev box: docs/log/findings.md, "Benchmarks".
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hymem_train.trainer.config import LossConfig, PackingConfig, TrainerConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--segments", type=int, default=16)
    ap.add_argument("--preset", default="tiny_teacher")
    ap.add_argument("--stage", type=int, default=-1, help="internal: run one stage, print its result")
    args = ap.parse_args()
    if args.stage < 0:
        res = {}
        for stage in (3, 0):
            cmd = [
                sys.executable,
                __file__,
                "--steps",
                str(args.steps),
                "--segments",
                str(args.segments),
                "--preset",
                args.preset,
                "--stage",
                str(stage),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            res[stage] = [float(x) for x in out.strip().splitlines()[-1].split()]
        (t3, l3), (t0, l0) = res[3], res[0]
        print(f"ZeRO-3 : {t3:.3f} s/step, final loss {l3:.4f}")
        print(f"ZeRO-0 : {t0:.3f} s/step, final loss {l0:.4f}")
        print(f"speed-up of ZeRO off on one CPU rank: {t3 / t0:.2f}x")
        return

    from data_pipeline.synthetic import pretraining_documents
    from hymem_train.models.presets import build_model, make_config
    from hymem_train.models.tokenizer import default_tokenizer
    from hymem_train.sft import load_segments
    from hymem_train.trainer.engine import Trainer
    from hymem_train.trainer.packing import TrainItem, plan_step

    tok = default_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:  # the real SFT reader: text_ids records -> segments
        path = Path(tmp) / "pretrain.jsonl"
        docs = pretraining_documents(args.steps * args.segments, seed=0)
        path.write_text(
            "".join(json.dumps({"text_ids": tok.encode(d) + [tok.eos_token_id]}) + "\n" for d in docs)
        )
        segments = load_segments(str(path))
    cfg = TrainerConfig(
        lr=2e-3,
        zero_stage=args.stage,
        gradient_checkpointing=False,
        routing_replay=False,
        loss=LossConfig(kind="sft"),
        packing=PackingConfig(num_tokens_per_micro_batch=32768, pad_to_multiple=64),
    )
    trainer = Trainer(cfg, build_model(make_config(args.preset), seed=0))
    times, loss = [], float("nan")
    for s in range(args.steps):
        items = [TrainItem(segment=seg) for seg in segments[s * args.segments : (s + 1) * args.segments]]
        plan = plan_step(items, cfg.packing, "sft", world_size=1)
        t = time.perf_counter()
        loss = trainer.train_step(plan[0])["train/loss"]
        times.append(time.perf_counter() - t)
    trainer.close()
    print(statistics.mean(times[3:]), loss)


if __name__ == "__main__":
    main()
