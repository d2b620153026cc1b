"""Peak host memory of exporting a ZeRO-3 step checkpoint, against the model's size (docs/export.md).

    PYTHONPATH=. python benchmarks/bench_export_memory.py --out /tmp/bench_export

Phase 1 (a subprocess) builds an HYV3 model from a config (~150M parameters: 8 layers, hidden 512,
32 experts of width 384), wraps it in the ZeRO-3 Trainer on one CPU rank and saves a step checkpoint.
Phase 2 (a fresh subprocess) exports it with the same code `python -m hymem_train.export` runs and
reports max RSS (getrusage) before and after the export, as a ratio to the model's bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from hymem_train.models.checkpoint_files import DeepSpeedWeights
from hymem_train.trainer.config import TrainerConfig

OVERRIDES = dict(
    num_hidden_layers=8,
    hidden_size=512,
    num_experts=32,
    num_experts_per_tok=2,
    moe_intermediate_size=384,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    mlp_layer_types=["sparse"] * 8,
)


def _config():
    from hymem_train.models.presets import make_config

    return make_config("tiny", **OVERRIDES)


def save(out: Path) -> None:
    from hymem_train.models.presets import build_model
    from hymem_train.trainer.engine import Trainer

    tr = Trainer(
        TrainerConfig(lr=1e-6, zero_stage=3, zero_persistence_threshold=0), build_model(_config(), seed=0)
    )
    tr.save(str(out / "checkpoints"), {})
    tr.close()


def _status() -> dict[str, int]:
    """RssAnon / RssFile (bytes) now: anonymous memory vs mapped file pages (the checkpoint's mmap)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("RssAnon", "RssFile")):
            k, v = line.split(":")
            out[k] = int(v.split()[0]) * 1024
    return out


def export(out: Path) -> None:
    import torch

    from hymem_train.models.tokenizer import default_tokenizer
    from hymem_train.trainer.export import CardInfo, skeleton_entries, write_hf_dir

    cfg = _config()
    n_params = sum(int(torch.Size(s).numel()) for _, s, _ in skeleton_entries(cfg))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    before = _status()
    t0 = time.perf_counter()
    w = DeepSpeedWeights(out / "checkpoints" / "step_0")
    order = [n for n, _, _ in skeleton_entries(cfg)]
    write_hf_dir(
        w.iter_tensors(order),
        cfg,
        out / "hf",
        dtype=torch.bfloat16,
        tokenizer=default_tokenizer(),
        card=CardInfo(step=0),
        max_shard_bytes=100 * 10**6,
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    after = _status()  # the mapped partitions are still referenced by `w` here
    res = {
        "params": n_params,
        "bf16_bytes": 2 * n_params,
        "fp32_bytes": 4 * n_params,
        "rss_before_export": base,
        "rss_peak": peak,
        "export_rss_increase": peak - base,
        "increase_over_bf16_model": (peak - base) / (2 * n_params),
        "increase_over_fp32_model": (peak - base) / (4 * n_params),
        "peak_over_bf16_model": peak / (2 * n_params),
        "seconds": time.perf_counter() - t0,
        "rss_anon_before": before.get("RssAnon"),
        "rss_anon_after": after.get("RssAnon"),
        "rss_file_before": before.get("RssFile"),
        "rss_file_after": after.get("RssFile"),
        "shards": len(list((out / "hf").glob("*.safetensors"))),
    }
    print(json.dumps(res, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/bench_export")
    ap.add_argument("--phase", default="")
    a = ap.parse_args()
    out = Path(a.out)
    if a.phase == "save":
        return save(out)
    if a.phase == "export":
        return export(out)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for phase in ("save", "export") if not (out / "checkpoints" / "latest").exists() else ("export",):
        subprocess.run([sys.executable, __file__, "--out", str(out), "--phase", phase], check=True, env=env)


if __name__ == "__main__":
    main()
