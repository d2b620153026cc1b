#!/usr/bin/env bash
# The prepared GPU check: benchmarks/device_check.py on one GPU, one JSON of results.
#
#   scripts/device_check.sh [OUT.json]      # default: $OUT/device_check.json (the device tool's folder), else ./
#
# Needs only what the device image has: python3 with torch (CUDA), transformers, numpy. No DeepSpeed,
# Ray, Hydra or OmegaConf (the driver never imports them; tests/benchmarks/test_device_check.py
# proves it with the imports blocked). The repo root goes on PYTHONPATH: nothing is installed.
# Sections: train step MFU (bench_1b_active, bf16), chunked loss vs naive at T=32,768, routing-replay
# parity, packed segment attention vs separate forwards. Sized for < 8 minutes on one H200: a hard
# timeout of 470 s, and sections not started after 400 s are skipped (recorded as such in the JSON,
# which is rewritten after every section, so a kill keeps what finished). The log goes beside the JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
out_json=${1:-${OUT:-.}/device_check.json}
mkdir -p "$(dirname "$out_json")"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
timeout 470 "$py" benchmarks/device_check.py --out "$out_json" --budget-s 400 2>&1 | tee "${out_json%.json}.log"
