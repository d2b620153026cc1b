"""benchmarks/bench_train_step.py at micro size (one DeepSpeed step of the tiny preset) and the FLOP
count it divides by (train_step_lib.step_flops)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hymem_train.trainer.config import PackingConfig

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_step_flops_counts_real_tokens_loss_positions_and_per_segment_attention():
    import train_step_lib as lib

    from hymem_train.models.presets import count_params, make_config
    from hymem_train.trainer.packing import plan_step
    from tests.trainer.helpers import make_items

    cfg = make_config("tiny")
    items = make_items(5, vocab=cfg.vocab_size, seed=0, lengths=[(10, 4), (7, 3), (20, 5), (3, 2), (9, 9)])
    [mbs] = plan_step(items, PackingConfig(num_tokens_per_micro_batch=40, pad_to_multiple=16), "ppo")
    fl = lib.step_flops(cfg, mbs)
    T, N = sum(p + r for p, r in [(10, 4), (7, 3), (20, 5), (3, 2), (9, 9)]), 4 + 3 + 5 + 2 + 9
    VH = cfg.vocab_size * cfg.hidden_size
    assert (fl.real_tokens, fl.loss_positions, fl.segments) == (T, N, 5)
    assert fl.row_tokens > T  # padding exists and is not counted
    assert fl.dense == 6 * (count_params(cfg).active_non_embedding - VH) * T
    assert fl.head == 6 * VH * N
    sq = sum((p + r) ** 2 for p, r in [(10, 4), (7, 3), (20, 5), (3, 2), (9, 9)])
    assert fl.attention == 6 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * sq


@pytest.mark.slow  # ~1 min on the busy 2-core box: importing DeepSpeed and building its engine
def test_micro_run_prints_the_mfu_line():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/bench_train_step.py"), "--micro"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^\| grouped_mm \| off \| [\d.]+ \| [\d,]+ \|", out.stdout, re.M), out.stdout
    m = re.search(r"^MFU (\d+\.\d+) \(best: grouped_mm", out.stdout, re.M)
    assert m and float(m.group(1)) > 0, out.stdout
    assert "dense matmul peak (float32" in out.stdout
