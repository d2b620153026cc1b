"""The two stages end to end through their real CLIs (`python -m hymem_train.opd|rl`), on CPU with tiny
models, the native harness, Ray rollout actors, the Ray reward service and DeepSpeed ZeRO-3."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_pipeline.build import build, load_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
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
]  # fmt: skip


def _cmd(stage: str, a: dict, out: Path, *extra: str) -> list[str]:
    base = [sys.executable, "-m", f"hymem_train.{stage}", f"data.path={a['train']}", f"run.output_dir={out}", *COMMON]
    if stage == "opd":
        base += ["+exp=demo_opd", f"teacher.path={a['teacher']}", "init_checkpoint=", f"data.eval_path={a['eval']}",
                 "opd.num_rows_per_step=2"]  # fmt: skip
    else:
        base += ["+exp=demo_rl", f"reader_model.path={a['teacher']}", "rl.num_rollouts_per_window=2",
                 "rl.num_windows_per_step=2"]  # fmt: skip
    return base + list(extra)


def _run(cmd: list[str], log: Path, timeout: int = 600) -> None:
    with log.open("w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    assert r.returncode == 0, log.read_text()[-4000:]


def _metrics(out: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r for r in rows}


def test_opd_then_rl_short_runs(assets):
    root = assets["root"]
    opd = root / "opd"
    _run(_cmd("opd", assets, opd, "num_steps=2", "save_every=1"), root / "opd.log")
    m = _metrics(opd)
    assert {0, 1, 2} <= set(m)
    assert m[0]["eval/reverse_kl"] > 0 and "eval/reverse_kl" in m[2]
    for k in ("distill/reverse_kl_topk", "distill/teacher_token_coverage", "distill/entropy", "perf/time_rollout_s",
              "perf/time_teacher_s", "perf/time_train_s", "perf/time_sync_s"):  # fmt: skip
        assert k in m[1], k
    assert (opd / "final" / "model.safetensors").exists() and (opd / "opd_curves.png").exists()
    lineage = json.loads((opd / "lineage.json").read_text())
    assert len(lineage) >= 2  # each sequence's first window promoted a bank

    rl = root / "rl"
    _run(_cmd("rl", assets, rl, "num_steps=2", "save_every=1", f"init_checkpoint={opd}/final"), root / "rl.log")
    m = _metrics(rl)
    for k in ("reward/prm", "reward/s", "reward/excluded_rollout_share", "train/loss", "perf/time_reward_s"):
        assert k in m[1], k
    assert m[1]["reward/reader_calls"] > 0 and m[1]["rollout/segments"] > 0
    assert (rl / "final" / "model.safetensors").exists()


def _lineage_view(out: Path) -> dict:
    d = json.loads((out / "lineage.json").read_text())
    return {k: (v["num_entries"], v["known_text"], v["source_trajectory"], v["size_tokens"]) for k, v in d.items()}


def test_rl_kill9_then_resume_reproduces_the_uninterrupted_run(assets):
    root = assets["root"]
    args = ("num_steps=3", "save_every=1", "init_checkpoint=")
    ref = root / "rl_ref"
    _run(_cmd("rl", assets, ref, *args), root / "rl_ref.log")

    out = root / "rl_killed"
    log = (root / "rl_killed.log").open("w")
    p = subprocess.Popen(_cmd("rl", assets, out, *args), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 600
    while not (out / "checkpoints" / "step_2").exists():
        assert p.poll() is None, (root / "rl_killed.log").read_text()[-3000:]
        assert time.time() < deadline
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)  # kill -9 the run and every process it started (Ray workers too)
    p.wait()
    assert not (out / "final").exists()
    _run(_cmd("rl", assets, out, *args), root / "rl_resumed.log")

    assert _lineage_view(out) == _lineage_view(ref)
    a, b = _metrics(ref), _metrics(out)
    assert set(a) == set(b) == {0, 1, 2, 3}
    for step in a:
        for k, v in a[step].items():
            if k.startswith(("reward/", "rollout/segments", "rollout/policy_error", "train/loss", "eval/")):
                assert b[step][k] == pytest.approx(v, rel=1e-4, abs=1e-6), (step, k)
