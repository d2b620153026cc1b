"""benchmarks/bench_weight_sync.py at micro size: one replica process, the tiny model, one timed sync."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~30 s: three Python processes import torch and transformers
def test_micro_run_prints_the_ratio_line():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks/bench_weight_sync.py"),
        "--preset",
        "tiny",
        "--layers",
        "0",
        "--dtype",
        "float32",
        "--replicas",
        "1",
        "--rounds",
        "1",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^\| gloo group, replica receive \+ load \| [\d.]+ \| [\d.]+ \|", out.stdout, re.M), (
        out.stdout
    )
    m = re.search(r"^ratio gloo-group / in-process: (\d+\.\d+)x \(1 replicas\)", out.stdout, re.M)
    assert m and float(m.group(1)) > 0, out.stdout
