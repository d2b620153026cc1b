"""Trainer configs compose and validate; the SFT entry point trains, checkpoints, resumes and exports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hymem_train.config import ConfigError, compose, to_typed
from hymem_train.models.presets import build_model, make_config
from hymem_train.sft import SftConfig, load_segments, step_batches
from hymem_train.trainer.config import TrainerConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("group,kind,lr", [("opd", "opd", 1e-6), ("rl", "ppo", 5e-6), ("sft", "sft", 1e-5)])
def test_trainer_groups_validate(group, kind, lr):
    from omegaconf import OmegaConf

    cfg = to_typed(OmegaConf.load(ROOT / "configs" / "trainer" / f"{group}.yaml"), TrainerConfig)
    assert (cfg.loss.kind, cfg.lr) == (kind, lr)  # report: 1e-6 OPD, 5e-6 RL, constant


def test_sft_primary_composes():
    cfg = to_typed(compose("sft", ["data_path=x.jsonl"]), SftConfig)
    assert cfg.model.preset == "tiny_teacher" and cfg.trainer.loss.kind == "sft"


def test_bad_trainer_key_names_the_key():
    with pytest.raises(ConfigError, match="trainer.loss.entropy_coeff"):
        to_typed(compose("sft", ["data_path=x", "+trainer.loss.entropy_coeff=0.1"]), SftConfig)
    with pytest.raises(ValueError, match="trainer.loss.kind"):
        to_typed(compose("sft", ["data_path=x", "trainer=opd"]), SftConfig)


def _write_data(path: Path, n: int = 24, vocab: int = 896) -> None:
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for _ in range(n):
            p = rng.integers(5, vocab, 6).tolist()
            # learnable: the response repeats the prompt
            f.write(json.dumps({"prompt_ids": p, "response_ids": p[:4]}) + "\n")


def test_load_segments_names_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt_ids": [1, 2], "response_ids": [3]}\n{"prompt_ids": [1]}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:2: bad SFT record"):
        load_segments(str(p))


def test_text_ids_records_are_plain_language_modelling(tmp_path):
    # the demo's pretraining stand-in: loss on every token after the first
    p = tmp_path / "d.jsonl"
    p.write_text('{"text_ids": [7, 8, 9, 10]}\n{"prompt_ids": [1, 2], "response_ids": [3]}\n')
    a, b = load_segments(str(p))
    assert (a.prompt_ids, a.response_ids, len(a.logprobs)) == ([7], [8, 9, 10], 3)
    assert (b.prompt_ids, b.response_ids) == ([1, 2], [3])
    for bad in ('{"text_ids": [7]}', '{"text_ids": [7, 8], "response_ids": [9]}'):
        p.write_text(bad + "\n")
        with pytest.raises(ValueError, match=r"d.jsonl:1: bad SFT record: a text_ids record"):
            load_segments(str(p))


def test_step_batches_are_deterministic_epoch_shuffles(tmp_path):
    p = tmp_path / "d.jsonl"
    _write_data(p, n=10)
    cfg = to_typed(compose("sft", [f"data_path={p}", "num_epochs=2", "num_segments_per_step=4"]), SftConfig)
    segs = load_segments(str(p))
    a, b = step_batches(segs, cfg), step_batches(segs, cfg)
    assert [len(s) for s in a] == [4, 4, 2, 4, 4, 2]
    assert [[x.trajectory_id for x in s] for s in a] == [[x.trajectory_id for x in s] for s in b]
    assert sorted(x.trajectory_id for s in a[:3] for x in s) == sorted(x.trajectory_id for x in segs)


def _run_sft(tmp_path: Path, *over: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "hymem_train.sft",
        f"data_path={tmp_path / 'd.jsonl'}",
    ]
    if not any(o.startswith("out_dir=") for o in over):
        cmd.append(f"out_dir={tmp_path / 'run'}")
    cmd += ["model=tiny", "num_segments_per_step=8", "trainer.lr=3e-3", *over]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return res


@pytest.mark.slow
def test_sft_entry_point_trains_resumes_and_exports(tmp_path):
    _write_data(tmp_path / "d.jsonl", n=24)
    _run_sft(tmp_path, "num_epochs=4", "max_steps=6")
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(6))
    assert lines[-1]["train/loss"] < lines[0]["train/loss"]
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step_6"
    # a second run with more steps resumes at the saved cursor, not from zero
    _run_sft(tmp_path, "num_epochs=4", "max_steps=8")
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(8))
    # the export loads as a plain HF model with the trained weights
    import torch
    from transformers import HYV3ForCausalLM

    m, info = HYV3ForCausalLM.from_pretrained(
        tmp_path / "run" / "final", local_files_only=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info  # router bias buffers included
    assert (tmp_path / "run" / "final" / "tokenizer.json").exists() or any(
        (tmp_path / "run" / "final").glob("tok*")
    )

    init = build_model(make_config("tiny"), seed=0)
    diff = max((a - b).abs().max().item() for a, b in zip(m.parameters(), init.parameters(), strict=True))
    assert diff > 1e-4 and torch.isfinite(torch.tensor(diff))


def test_sft_stopped_early_then_resumed_is_the_uninterrupted_run(tmp_path):
    """The demo's student is an SFT run stopped after fewer epochs, and its teacher is that run resumed
    from the student's checkpoint with its last epoch annealed: the resumed steps must be the
    uninterrupted run's, loss for loss, and only the annealed epoch's rate falls."""
    _write_data(tmp_path / "d.jsonl", n=24)

    def sft(out: str, epochs: int, *over: str) -> tuple[list[float], list[float]]:
        _run_sft(tmp_path, f"out_dir={tmp_path / out}", f"num_epochs={epochs}", *over)
        rows = [json.loads(x) for x in (tmp_path / out / "metrics.jsonl").read_text().splitlines()]
        return [r["train/loss"] for r in rows], [r["train/lr"] for r in rows]

    whole, whole_lr = sft("whole", 2, "anneal_epochs=1")  # 3 steps per epoch
    early, early_lr = sft("early", 1)
    shutil.copytree(tmp_path / "early" / "checkpoints", tmp_path / "late" / "checkpoints")
    late, late_lr = sft("late", 2, "anneal_epochs=1")  # resumes at the early run's cursor
    assert len(whole) == 6 and len(early) == 3 and len(late) == 3
    assert early == pytest.approx(whole[:3], rel=1e-6) and late == pytest.approx(whole[3:], rel=1e-6)
    # the rate each step used: constant, then linear over the last epoch's 3 steps
    assert whole_lr == early_lr + late_lr == pytest.approx([3e-3] * 3 + [3e-3, 2e-3, 1e-3])
    with pytest.raises(ValueError, match="anneal_epochs=3: want 0 <= anneal_epochs <= num_epochs=2"):
        to_typed(compose("sft", ["data_path=x", "num_epochs=2", "anneal_epochs=3"]), SftConfig)
