"""Weight sync throughput: seconds per GB from trainer rank 0 to engine replicas over a gloo
weight-update group (hymem_train/trainer/weight_group.py, the path a multi-node run takes), against a
plain in-process `load_state_dict` of the same tensors into the same engine model (the single-process
path), measured in one run. Each replica is its own process holding a real HF engine.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_weight_sync.py     # bench_1b_active cut to 1 layer, bf16 (~1.6 GB), 2 replicas
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_weight_sync.py --preset tiny --layers 0 --dtype float32 --replicas 1 --rounds 2

Both paths move the same bytes: the model's parameters and persistent buffers, in the training dtype
(`--dtype`; the router stays fp32 as HYV3 keeps it). The group path includes the header per bucket, the flattening on the sender, the copy into
the engine's parameters on every replica; the baseline is `HFEngine.update_weights` with the whole
state dict in one call (a copy per tensor). Times are medians over `--rounds` syncs after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hymem_train.trainer.weight_group import WeightBroadcaster, open_weight_group, receive_weights
from hymem_train.trainer.weight_sync import WeightSyncConfig, sync_weights

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model(args, seed: int):
    from hymem_train.models.presets import build_model, make_config

    over = {"num_hidden_layers": args.layers} if args.layers else {}
    if args.layers:
        over["mlp_layer_types"] = ["sparse"] * args.layers
    return build_model(make_config(args.preset, **over), seed=seed, dtype=getattr(torch, args.dtype))


def replica_main(args) -> None:
    from hymem_train.engines.hf import HFEngine

    torch.set_num_threads(1)
    engine = HFEngine(_model(args, seed=1), [2], pad_token_id=0)
    group = open_weight_group("127.0.0.1", args.port, args.rank, args.replicas + 1)
    stats = [receive_weights(group, engine) for _ in range(args.rounds + 1)]
    print(json.dumps(stats[1:]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="bench_1b_active")
    ap.add_argument("--layers", type=int, default=1, help="override the preset's layer count (0: keep)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=64.0)
    ap.add_argument("--replica-rank", type=int, default=0, help=argparse.SUPPRESS)  # internal
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.replica_rank:
        args.rank = args.replica_rank
        return replica_main(args)

    from hymem_train.engines.hf import HFEngine

    torch.set_num_threads(1)
    trained = _model(args, seed=0)
    state = {n: p.detach() for n, p in trained.named_parameters()}
    state.update({n: b.detach() for n, b in trained.named_buffers() if "e_score" in n})
    gb = sum(t.numel() * t.element_size() for t in state.values()) / 1e9

    # baseline: the same tensors into the same kind of engine, in this process
    engine = HFEngine(_model(args, seed=1), [2], pad_token_id=0)
    base = []
    for i in range(args.rounds + 1):
        t0 = time.perf_counter()
        engine.update_weights(state.items(), version=i)
        base.append(time.perf_counter() - t0)
    base_s = statistics.median(base[1:])
    del engine  # the baseline's model: memory for the replicas

    port = _free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--preset",
                args.preset,
                "--replicas",
                str(args.replicas),
                "--rounds",
                str(args.rounds),
                "--layers",
                str(args.layers),
                "--dtype",
                args.dtype,
                "--replica-rank",
                str(r),
                "--port",
                str(port),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(1, args.replicas + 1)
    ]
    tx = WeightBroadcaster(open_weight_group("127.0.0.1", port, 0, args.replicas + 1))
    cfg = WeightSyncConfig(bucket_mb=args.bucket_mb)
    group = [
        sync_weights(trained, [tx], version=i, cfg=cfg)["perf/weight_sync_seconds"]
        for i in range(args.rounds + 1)
    ]
    outs = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    group_s = statistics.median(group[1:])
    recv_s = statistics.median(s["seconds"] for o in outs for s in o)
    print(
        f"preset {args.preset}: {gb:.3f} GB of parameters + buffers, {args.replicas} replica process(es), "
        f"bucket {args.bucket_mb:g} MiB, median of {args.rounds} syncs after a warm-up"
    )
    print("| path | seconds per sync | seconds per GB |")
    print("|---|---|---|")
    print(f"| in-process load_state_dict (baseline) | {base_s:.3f} | {base_s / gb:.2f} |")
    print(f"| gloo group, sender (rank 0) | {group_s:.3f} | {group_s / gb:.2f} |")
    print(f"| gloo group, replica receive + load | {recv_s:.3f} | {recv_s / gb:.2f} |")
    print(f"ratio gloo-group / in-process: {group_s / base_s:.2f}x ({args.replicas} replicas)")


if __name__ == "__main__":
    main()
