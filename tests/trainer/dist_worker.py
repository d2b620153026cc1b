"""torchrun worker for the distributed trainer tests (not collected by pytest: no test_ prefix).

    torchrun --nproc_per_node 2 tests/trainer/dist_worker.py --out /tmp/x --steps 2 --capacity 24

Trains the tiny HYV3 model with ZeRO-3 on CPU/gloo on a deterministic data stream (step s uses
seed 100 + s), writes per-step metrics (`<out>.json`) and the final full parameters (`<out>.pt`).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
from pathlib import Path

from hymem_train.models import checkpoint_files
from hymem_train.models.config import ModelConfig
from hymem_train.trainer.engine import load_trainer_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hymem_train.models.presets import build_model, make_config  # noqa: E402
from hymem_train.trainer.config import LossConfig, PackingConfig, TrainerConfig  # noqa: E402
from hymem_train.trainer.engine import Trainer  # noqa: E402
from hymem_train.trainer.packing import plan_step  # noqa: E402
from hymem_train.trainer.weight_group import WeightBroadcaster, open_weight_group  # noqa: E402
from hymem_train.trainer.weight_sync import WeightSyncConfig, iter_full_param_buckets  # noqa: E402
from tests.trainer.helpers import make_items  # noqa: E402


def step_items(step: int, vocab: int, kind: str, num_layers: int, num_experts: int, top_k: int):
    items = make_items(8, vocab=vocab, seed=100 + step, kind=kind)
    rng = np.random.default_rng(1000 + step)
    for it in items:  # routes as an engine would report them: distinct experts, last token unrouted
        T = it.segment.num_tokens
        r = np.argsort(rng.random((T, num_layers, num_experts)), axis=-1)[..., :top_k].astype(np.int16)
        r[-1] = -1
        it.segment.routed_experts_TLK = r
    return items


def trainer_config(args) -> TrainerConfig:
    # adam_eps >> sqrt(v) makes the AdamW update ~ lr * grad, so a wrongly scaled gradient shows in the
    # weights (plain Adam is invariant to a global gradient scale and would hide it)
    return TrainerConfig(
        lr=args.lr,
        adam_eps=args.adam_eps,
        max_grad_norm=0.0,
        zero_stage=args.zero_stage,
        zero_persistence_threshold=0,  # partition every parameter, lm_head included, as at full scale
        zero_init=not args.no_zero_init,
        loss=LossConfig(kind=args.kind, ratio_source=args.ratio_source, block_rows=16, block_vocab=256),
        packing=PackingConfig(
            num_tokens_per_micro_batch=args.capacity, max_segments_per_micro_batch=args.max_segments
        ),
    )


def load_counted(path: str, cfg: TrainerConfig):
    """load_trainer_model, counting the parameters this rank read from a step checkpoint, and the
    partition state of every parameter before DeepSpeed."""
    reads: list[str] = []
    get = checkpoint_files.DeepSpeedWeights.get

    def counted(self, name):
        reads.append(name)
        return get(self, name)

    checkpoint_files.DeepSpeedWeights.get = counted
    try:
        model = load_trainer_model(ModelConfig(path=path, attn_implementation="eager"), cfg)
    finally:
        checkpoint_files.DeepSpeedWeights.get = get
    params = dict(model.named_parameters())
    return model, {
        "partitioned": [n for n, p in params.items() if hasattr(p, "ds_id") and p.numel() == 0],
        "num_params": len(params),
        "local_numel": sum(
            p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in params.values()
        ),
        "full_numel": sum(getattr(p, "ds_numel", p.numel()) for p in params.values()),
        "param_reads": sorted(set(reads) & set(params)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--max-segments", type=int, default=0)
    ap.add_argument("--kind", default="ppo")
    ap.add_argument("--ratio-source", default="rollout")
    ap.add_argument("--save-dir", default="")
    ap.add_argument("--load-dir", default="")
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--adam-eps", type=float, default=1.0)
    ap.add_argument("--zero-stage", type=int, default=3)
    ap.add_argument("--weight-group", default="", help="HOST:PORT:WORLD: sync to replicas after training")
    ap.add_argument("--init-from", default="", help="a checkpoint (HF dir or step dir) instead of the preset")
    ap.add_argument("--no-zero-init", action="store_true", help="load --init-from whole on every rank")
    args = ap.parse_args()
    faulthandler.enable(all_threads=True)  # a rank that aborts prints every thread's Python stack
    torch.set_num_threads(1)
    cfg = trainer_config(args)
    load = {}
    if args.init_from:
        model, load = load_counted(args.init_from, cfg)
    else:
        model = build_model(make_config("tiny", attn_implementation="eager"), seed=0)
    mc = model.config
    tr = Trainer(cfg, model)
    if load:  # every rank's view of the load, before DeepSpeed touched the model
        Path(f"{args.out}.load{tr.rank}.json").write_text(json.dumps(load))
    start = 0
    if args.load_dir:
        start = int(tr.load(args.load_dir)["data_cursor"])
    records = []
    for s in range(start, start + args.steps):
        items = step_items(
            s, mc.vocab_size, args.kind, mc.num_hidden_layers, mc.num_experts, mc.num_experts_per_tok
        )
        plan = plan_step(items, cfg.packing, args.kind, world_size=tr.world_size)
        m = tr.train_step(plan[tr.rank])
        m["num_micro_batches"] = len(plan[tr.rank])
        records.append(m)
    if args.save_dir:
        tr.save(args.save_dir, {"data_cursor": start + args.steps})
    sync = {}
    if args.weight_group:  # rank 0 joins the replicas' group; every rank gathers (collective)
        host, port, world = args.weight_group.rsplit(":", 2)
        rx = []
        if tr.rank == 0:
            rx = [WeightBroadcaster(open_weight_group(host, int(port), 0, int(world)))]
        sync = tr.sync_weights(rx, version=start + args.steps, cfg=WeightSyncConfig(bucket_mb=0.05))
    full = {n: t for b in iter_full_param_buckets(model, 1 << 20) for n, t in b}
    if tr.rank == 0:
        torch.save(full, args.out + ".pt")
        Path(args.out + ".json").write_text(json.dumps(records))
        Path(args.out + ".sync.json").write_text(json.dumps(sync))
    tr.close()


if __name__ == "__main__":
    main()
