"""Host memory of the trainer's model load on 2 ZeRO-3 ranks: `trainer.zero_init` on vs off (docs/cluster.md).

    PYTHONPATH=. python benchmarks/bench_zero_init_load.py --out /tmp/bench_zero_init

Writes an HF checkpoint of ~150M parameters (bench_export_memory's config, fp32, 100 MB safetensors
shards), then for each mode starts 2 torchrun ranks on CPU/gloo that call `load_trainer_model` (the
stages' load) and report, per rank, the anonymous memory it added (RssAnon after minus before: the
model's own tensors; the checkpoint's memory-mapped pages are RssFile, page cache shared by the ranks)
the peak RSS it added (VmHWM: anonymous and mapped pages) and the load's seconds; malloc_trim first,
so "kept" is what the load holds, not what malloc caches. Prints the model's bytes and, per rank, on/off ratios measured in this run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from hymem_train.models.config import ModelConfig
from hymem_train.trainer.config import TrainerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _rss() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("RssAnon", "RssFile", "VmHWM")):
            k, v = line.split(":")
            out[k] = int(v.split()[0]) * 1024
    return out


def worker(hf: str, zero_init: bool, out: str) -> None:
    import torch

    from hymem_train.trainer.engine import init_distributed, load_trainer_model

    torch.set_num_threads(1)
    rank, _ = init_distributed()  # before the baseline: the process group is not part of the load
    cfg = TrainerConfig(lr=1e-6, zero_stage=3, zero_persistence_threshold=0, zero_init=zero_init)
    before, t0 = _rss(), time.perf_counter()
    model = load_trainer_model(ModelConfig(path=hf, attn_implementation="eager"), cfg)
    seconds = time.perf_counter() - t0
    peak = _rss()["VmHWM"]
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # what the load keeps, not what malloc still caches
    after = _rss()
    local = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in model.parameters())
    rec = {
        "rank": rank,
        "anon_added": after["RssAnon"] - before["RssAnon"],
        "peak_added": peak - before["VmHWM"],
        "file_after": after["RssFile"],
        "seconds": seconds,
        "local_params": local,
    }
    Path(f"{out}.{rank}.json").write_text(json.dumps(rec))
    torch.distributed.barrier()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/bench_zero_init")
    ap.add_argument("--worker", nargs=3, metavar=("HF", "ZERO_INIT", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker[0], args.worker[1] == "1", args.worker[2])
    from bench_export_memory import _config

    from hymem_train.models.presets import build_model, count_params

    out = Path(args.out)
    hf = out / "hf"
    if not (hf / "config.json").exists():
        build_model(_config(), seed=0).save_pretrained(hf, max_shard_size="100MB")
    n = count_params(_config()).total
    shards = len(list(hf.glob("*.safetensors")))
    print(
        f"model: {n / 1e6:.1f}M parameters, {4 * n / 2**20:.0f} MiB in fp32, {shards} safetensors shards; 2 ranks"
    )
    torchrun = Path(sys.executable).with_name("torchrun")
    # large blocks from mmap: a freed gather goes back to the OS, so the peak is live tensors, not the
    # heap glibc keeps after freeing them (with its default threshold rank 1's peak read 1.9x higher)
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "MALLOC_MMAP_THRESHOLD_": "65536",
    }
    recs = {}
    for mode in ("0", "1"):
        tag = str(out / f"mode{mode}")
        cmd = [
            str(torchrun),
            "--nproc_per_node",
            "2",
            "--master_port",
            str(_free_port()),
            __file__,
            "--worker",
            str(hf),
            mode,
            tag,
        ]
        subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
        recs[mode] = [json.loads(Path(f"{tag}.{r}.json").read_text()) for r in range(2)]
    print(
        "| rank | zero_init | anon MiB kept | of the model | peak RSS MiB added | of the model | load s | params held |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in range(2):
        for mode in ("0", "1"):
            x = recs[mode][r]
            print(
                f"| {r} | {'on' if mode == '1' else 'off'} | {x['anon_added'] / 2**20:.0f} | "
                f"{x['anon_added'] / (4 * n):.2f} | {x['peak_added'] / 2**20:.0f} | {x['peak_added'] / (4 * n):.2f} | "
                f"{x['seconds']:.1f} | {x['local_params'] / n:.2f} |"
            )
    for r in range(2):
        off, on = recs["0"][r], recs["1"][r]
        print(
            f"rank {r}: zero_init on / off: kept {on['anon_added'] / off['anon_added']:.2f}x, "
            f"peak {on['peak_added'] / off['peak_added']:.2f}x"
        )


if __name__ == "__main__":
    main()
