"""The two stages end to end through their real CLIs (`python -m hymem_train.opd|rl`), on CPU with tiny
models, the native harness, Ray rollout actors, the Ray reward service and DeepSpeed ZeRO-3."""

import json
import os
import signal
import subprocess
import time

import pytest

from tests.stages.conftest import RL_TWO_STEPS

pytestmark = pytest.mark.slow


def test_opd_then_rl_short_runs(stage, opd_one_rank, rl_one_rank):
    # the shared reference runs (OPD 2 steps, then RL 2 steps from its `final`), read only
    opd, rl = opd_one_rank, rl_one_rank
    m = stage.metrics(opd)
    assert {0, 1, 2} <= set(m)
    assert m[0]["eval/reverse_kl"] > 0 and "eval/reverse_kl" in m[2]
    for k in (
        "distill/reverse_kl_topk",
        "distill/teacher_token_coverage",
        "distill/entropy",
        "perf/time_rollout_s",
        "perf/time_teacher_s",
        "perf/time_train_s",
        "perf/time_sync_s",
    ):
        assert k in m[1], k
    assert (opd / "final" / "model.safetensors").exists() and (opd / "opd_curves.png").exists()
    lineage = json.loads((opd / "lineage.json").read_text())
    assert len(lineage) >= 2  # each sequence's first window promoted a bank
    _check_bank_sizes(opd, m, rollouts_per_step=2 * 2)  # opd.num_rows_per_step=2 x 2 rollouts per row

    assert f"init_checkpoint: {opd}/final" in (rl / "config.yaml").read_text()
    m = stage.metrics(rl)
    for k in ("reward/prm", "reward/s", "reward/excluded_rollout_share", "train/loss", "perf/time_reward_s"):
        assert k in m[1], k
    assert m[1]["reward/reader_calls"] > 0 and m[1]["rollout/segments"] > 0
    assert (rl / "final" / "model.safetensors").exists()
    _check_bank_sizes(rl, m, rollouts_per_step=2 * 2)  # 2 windows x 2 rollouts


def _check_bank_sizes(run, m, rollouts_per_step: int) -> None:
    """`bank_sizes.jsonl` (the input of reward.calibrate_growth) has every training rollout, and its
    chunk statuses agree with the step's own rollout metrics."""
    from reward.calibrate_growth import load_rows

    rows = load_rows([run])
    steps = [s for s in m if "rollout/policy_error_chunks" in m[s]]
    assert len(rows) == rollouts_per_step * len(steps)
    for s in steps:
        mine = [r for r in rows if r["step"] == s]
        assert (
            sum(st == "policy_error" for r in mine for st in r["chunk_status"])
            == m[s]["rollout/policy_error_chunks"]
        )
        assert all(len(r["size_tokens"]) == len(r["chunk_status"]) > 0 for r in mine)
        assert all(
            isinstance(x, int) and x >= 0 for r in mine if r["status"] == "ok" for x in r["size_tokens"]
        )


def _lineage_view(out) -> dict:
    d = json.loads((out / "lineage.json").read_text())
    return {
        k: (v["num_entries"], v["known_text"], v["source_trajectory"], v["size_tokens"]) for k, v in d.items()
    }


def test_rl_kill9_then_resume_reproduces_the_uninterrupted_run(assets, stage, opd_one_rank, rl_one_rank):
    # the uninterrupted run is the shared 1-rank RL reference (2 steps from the OPD reference's weights),
    # run in the same environment. The run is killed twice: inside step 1 after its windows advanced the
    # scheduler but before any checkpoint (it must start over, not skip them), then after step 1's checkpoint
    root, ref = assets["root"], rl_one_rank
    args = (*RL_TWO_STEPS, f"init_checkpoint={opd_one_rank}/final")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    out = root / "rl_killed"
    ckpt = out / "checkpoints"

    def kill_when(ready, name: str) -> None:
        log = (root / f"{name}.log").open("w")
        p = subprocess.Popen(
            stage.cmd("rl", assets, out, *args),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
        deadline = time.time() + 600
        while not ready():
            assert p.poll() is None, (root / f"{name}.log").read_text()[-3000:]
            assert time.time() < deadline
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGKILL)  # kill -9 the run and every process it started (Ray workers too)
        p.wait()

    def advanced() -> bool:  # scheduler.json (atomic) moves when step 1's windows are done
        path = out / "scheduler.json"
        return path.exists() and any(json.loads(path.read_text())["cursor"].values())

    # step 1's checkpoint follows its training, seconds after its windows advanced
    kill_when(advanced, "rl_killed_before_checkpoint")
    assert not (ckpt / "latest").exists()

    # DeepSpeed creates `latest`, then writes the tag into it: wait for the tag
    def step_1_done() -> bool:
        return (ckpt / "latest").exists() and (ckpt / "latest").read_text().strip() == "step_1"

    kill_when(step_1_done, "rl_killed_after_checkpoint")
    assert not (out / "final").exists()
    # the stage writes step 1's metrics line after its checkpoint; whether or not this kill landed between
    # the two, make it so: the resumed run starts at step 2 and must restore the line from the checkpoint
    metrics_file = out / "metrics.jsonl"
    kept = [x for x in metrics_file.read_text().splitlines() if not x.startswith('{"step": 1,')]
    metrics_file.write_text("".join(x + "\n" for x in kept))
    stage.run(stage.cmd("rl", assets, out, *args), root / "rl_resumed.log", env=env)

    assert _lineage_view(out) == _lineage_view(ref)
    # the killed run's re-done step re-recorded its rollouts; read back, nothing is lost or doubled
    from reward.calibrate_growth import load_rows

    def sizes(run):
        return sorted(
            (r["trajectory_id"], r["parent_size_tokens"], r["size_tokens"]) for r in load_rows([run])
        )

    assert sizes(out) == sizes(ref)
    a, b = stage.metrics(ref), stage.metrics(out)
    assert set(a) == set(b) == {0, 1, 2}
    assert b[1]["run/restored"] == 1 and "run/restored" not in b[2]
    for step in a:
        for k, v in a[step].items():
            if k.startswith(("reward/", "rollout/segments", "rollout/policy_error", "train/loss", "eval/")):
                assert b[step][k] == pytest.approx(v, rel=1e-4, abs=1e-6), (step, k)
