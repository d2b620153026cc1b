"""A short RL run under injected faults.

Injected: the sandbox of rollout 1 is SIGKILLed while it writes chunk 1 (and on every retry); the
rollout worker process running rollout 3 exits at chunk 0 (Ray restarts it); the judge times out on every 4th call; the tiny policy writes malformed output on its own; rollout 0
presents its key under another trajectory's path once per window. The run must finish, classify each
fault as docs/glossary.md (the nine silent failures) says, count it, and leave every promoted bank intact.
"""

import json
import re
import subprocess
import sys
import threading

import pytest

from harnesses.native import NativeConfig, NativeHarness
from tests.doubles.openai_server import HttpFailure, StandInServer

pytestmark = pytest.mark.slow


def _rl_cmd(assets, stage, out, *extra: str) -> list[str]:
    """Two RL steps of 2 windows x 4 rollouts from a fresh tiny policy, the model reader, no held-out set."""
    return [
        sys.executable,
        "-m",
        "hymem_train.rl",
        "+exp=demo_rl",
        f"data.path={assets['train']}",
        f"run.output_dir={out}",
        "data.eval_path=",
        "reader_kind=model",
        f"reader_model.path={assets['teacher']}",
        "init_checkpoint=",
        *stage.COMMON,
        "rl.num_rollouts_per_window=4",
        "rl.num_windows_per_step=2",
        "num_steps=2",
        "save_every=1",
        *extra,
    ]


def _judge():
    lock, n = threading.Lock(), [0]

    def reply(body):
        with lock:
            n[0] += 1
            k = n[0]
        if k % 4 == 0:
            return HttpFailure(status=200, delay_s=3.0)  # longer than the client's timeout
        text = body["messages"][-1]["content"]
        cand = re.search(r"^Candidate answer: (.*)$", text, re.M).group(1).strip().lower()
        if "Gold facts:" in text:
            return json.dumps({"score": 0.0, "recovered": []})
        ref = re.search(r"^Reference answer: (.*)$", text, re.M).group(1).strip().lower()
        return json.dumps({"score": float(cand == ref)})

    return reply


def test_rl_run_classifies_and_counts_injected_faults(assets, stage):
    root = assets["root"]
    out = root / "rl_faults"
    with StandInServer(_judge()) as judge:
        cmd = _rl_cmd(
            assets,
            stage,
            out,
            "harnesses.native.in_process=false",  # a sandbox process to kill
            "harnesses.native.num_retries=1",
            "reward.judge_kind=llm",
            f"reward.judge.base_url={judge.base_url}",
            "reward.judge.model=judge",
            "reward.judge.timeout_s=1.0",
            "reward.judge.num_retries=0",
            'rollout.faults.kill_sandbox=["1:1"]',
            "rollout.faults.foreign_identity=[0]",
            'rollout.faults.kill_worker=["3:0"]',
            "rollout.max_worker_restarts=8",
            # one rollout per actor, so the killed worker takes only rollout 3 with it (with several per
            # actor it takes its neighbours too: tests/rollout/test_actor_slots.py)
            "rollout.num_workers=8",
            "rollout.rollouts_per_worker=1",
            "rollout.num_cpus_per_worker=0.09",
        )
        log = root / "rl_faults.log"
        with log.open("w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=900)
        assert r.returncode == 0, log.read_text()[-4000:]

    m = stage.metrics(out)
    steps = [m[s] for s in (1, 2)]
    for s in steps:
        # sandbox killed mid-window, on every retry: a platform error, excluded, never scored (silent failure platform-error-as-reward)
        # + the worker that died under rollout 3: a platform error too, counted as lost, nothing trained
        assert s["rollout/platform_error_rollouts"] == 4  # rollouts 1 and 3 of each of the 2 windows
        assert s["rollout/lost_worker_rollouts"] == 2
        assert s["reward/excluded_rollout_share"] == pytest.approx(4 / 8)
        # ... reported as such by the write itself (after its retry), not only noticed later: a crash
        # reported as a clean write still ends the rollout platform_error, through the unreadable bank
        assert s["rollout/platform_error_writes"] == 2
        # judge timeouts: excluded and counted, never a 0 for the policy
        assert s["reward/judge_faults"] > 0
        # the tiny random policy's malformed output: policy_error chunks, scored (silent failure malformed-as-platform-error)
        assert s["rollout/policy_error_chunks"] > 0
        # foreign identity: refused and counted by the gateway (silent failure shared-identity)
        assert s["gateway/rejected_mismatch"] == 2
        # a window whose every rollout lost cells to judge faults has no fully valid rollout: it is
        # retried next step with its lineage unchanged, never promoted from a partly scored group
        assert s["rollout/windows_done"] >= 1
    # promoted banks are intact: reopen each one from disk and check its known record (silent failure bank-not-carried)
    from hymem_train.rollout.lineage import BankLineage

    lineage = BankLineage(out, lambda name: NativeHarness(None, _native_cfg()))
    assert len(lineage.banks) == sum(s["rollout/windows_done"] for s in steps) >= 2
    for b in lineage.banks.values():
        # the killed rollouts are never promoted
        assert b.source_trajectory.rsplit("-", 1)[-1] not in ("r1", "r3")
        lineage.verify(b)
    assert (out / "final" / "model.safetensors").exists()


def _native_cfg():
    return NativeConfig(num_context_memories=6, max_tokens=24)  # as configs/exp/demo_rl.yaml, with COMMON


def test_a_dying_actor_of_several_rollouts_loses_them_all_as_platform_errors(assets, stage):
    """The demo's RL runs 4 rollouts per Ray actor: the process killed under rollout 3 takes the rollouts
    sharing its actor with it. Each is a platform_error (silent failure platform-error-as-reward), none
    is trained on or promoted, and the actor is replaced once, so the run finishes."""
    out = assets["root"] / "rl_actor_death"
    cmd = _rl_cmd(
        assets,
        stage,
        out,
        'rollout.faults.kill_worker=["3:0"]',
        "rollout.max_worker_restarts=8",
        "rollout.num_workers=2",
        "rollout.rollouts_per_worker=4",
        "rollout.num_cpus_per_worker=0.2",
    )
    log = assets["root"] / "rl_actor_death.log"
    with log.open("w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=900)
    assert r.returncode == 0, log.read_text()[-4000:]
    m = stage.metrics(out)
    for s in (m[1], m[2]):
        lost = s["rollout/lost_worker_rollouts"]
        assert lost > 2  # more than the two rollouts 3: their actor's other rollouts went with it
        assert s["rollout/platform_error_rollouts"] >= lost
        assert s["reward/excluded_rollout_share"] == pytest.approx(s["rollout/platform_error_rollouts"] / 8)
    from hymem_train.rollout.lineage import BankLineage

    lineage = BankLineage(out, lambda name: NativeHarness(None, _native_cfg()))
    for b in lineage.banks.values():
        assert b.source_trajectory.rsplit("-", 1)[-1] != "r3"
        lineage.verify(b)
