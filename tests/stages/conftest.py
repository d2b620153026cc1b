"""Shared assets and helpers for the stage tests (real CLIs, tiny models, CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from data_pipeline.build import build, load_config


@pytest.fixture(scope="session")
def assets(tmp_path_factory):
    from hymem_train.models import build_model
    from hymem_train.models.tokenizer import default_tokenizer

    root = tmp_path_factory.mktemp("stages")

    def data(name, n_seq, n_chunks, seed):
        cfg = load_config([
            f"out_dir={root / name}", f"data.synthetic.num_sequences={n_seq}",
            f"data.synthetic.num_chunks_per_sequence={n_chunks}", "data.synthetic.num_chunks_per_window=2",
            f"data.synthetic.seed={seed}", "data.profiles.hy_memory.num_chunks_per_window=2",
        ])  # fmt: skip
        return build(cfg)[0]["hy_memory"]

    train, held = data("train", 2, 4, 0), data("eval", 1, 2, 7)
    teacher = root / "teacher"
    build_model("tiny_teacher", seed=1).save_pretrained(teacher)
    default_tokenizer().save_pretrained(teacher)
    return {"root": root, "train": train, "eval": held, "teacher": teacher}


COMMON = [
    "harnesses.native.native.max_tokens=24", "engine.max_model_len=1024", "rollout.num_workers=2",
    "trainer.gradient_checkpointing=false", "trainer.packing.num_tokens_per_micro_batch=4096",
    "trainer.packing.pad_to_multiple=8", "logging.wandb_mode=disabled", "cluster.num_cpus=2",
    # the demo_* configs switch ZeRO off (one CPU rank, see configs/exp/demo_rl.yaml); the stage tests
    # keep the report's ZeRO-3 path under kill -9 / resume / 2 ranks. tests/trainer/test_engine_dist.py
    # checks that stage 0 trains and resumes exactly like stage 3.
    "trainer.zero_stage=3",
]  # fmt: skip


def _cmd(stage: str, a: dict, out: Path, *extra: str) -> list[str]:
    base = [
        sys.executable,
        "-m",
        f"hymem_train.{stage}",
        f"data.eval_path={a['eval']}",
        f"data.path={a['train']}",
        f"run.output_dir={out}",
        *COMMON,
    ]
    if stage == "opd":
        base += ["+exp=demo_opd", f"teacher.path={a['teacher']}", "init_checkpoint=",
                 "opd.num_rows_per_step=2"]  # fmt: skip
    else:
        base += ["+exp=demo_rl", f"reader_model.path={a['teacher']}", "rl.num_rollouts_per_window=2",
                 "rl.num_windows_per_step=2"]  # fmt: skip
    return base + list(extra)


def _run(cmd: list[str], log: Path, timeout: int = 900, env: dict | None = None) -> None:
    with log.open("w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env)
    assert r.returncode == 0, log.read_text()[-4000:]


def _metrics(out: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r for r in rows}


@pytest.fixture(scope="session")
def stage():
    return SimpleNamespace(COMMON=COMMON, cmd=_cmd, run=_run, metrics=_metrics)


OPD_TWO_STEPS = ("num_steps=2", "save_every=1")


@pytest.fixture(scope="session")
def opd_one_rank(assets):
    """The reference run the multi-rank and multi-node tests reproduce: OPD, 2 steps, 1 rank, 1 node."""
    out = assets["root"] / "opd_r1"
    # the environment the runs it is compared with use (thread count changes float reduction order)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    _run(_cmd("opd", assets, out, *OPD_TWO_STEPS), assets["root"] / "opd_r1.log", env=env)
    return out
