"""The preflight (hymem_train/plan.py): the full-size experiments fit 16 x 8 H20s and H200s, the numbers
it prints follow from the config, and each impossible plan is refused with its own reason."""

import math
import subprocess
import sys

import pytest

from hymem_train.config import compose, to_typed
from hymem_train.models.presets import count_params, make_config
from hymem_train.plan import PlanError, format_plan, make_plan
from hymem_train.run_config import OpdConfig, RlConfig

SCHEMA = {"opd": OpdConfig, "rl": RlConfig}
GPU_GB = {"slurm_16x8": 96, "slurm_16x8_h200": 141}
P = count_params(make_config("hy_memory_30b_a3b")).total  # the student, teacher, reader and judge alike


def _cfg(stage: str, *overrides: str):
    return to_typed(compose(stage, [f"+exp=hy_memory_{stage}", *overrides]), SCHEMA[stage])


def _plan(stage: str, *overrides: str):
    return make_plan(_cfg(stage, *overrides))


@pytest.mark.parametrize("cluster", sorted(GPU_GB))
@pytest.mark.parametrize("stage", ["opd", "rl"])
def test_full_size_experiments_fit(stage, cluster):
    plan = _plan(stage, f"cluster={cluster}")
    gb = GPU_GB[cluster]
    # placement: 64 trainer ranks on nodes 0-7, policy 8 x TP 4 on nodes 8-11, the stage's frozen models after
    roles = {p.role: (p.first_gpu, p.num_gpus, p.tp, p.nodes(8)) for p in plan.pools}
    frozen = (
        {"teacher": (96, 32, 4, "12-15")}
        if stage == "opd"
        else {"reader": (96, 16, 2, "12-13"), "judge": (112, 16, 2, "14-15")}
    )
    assert roles == {"train": (0, 64, 1, "0-7"), "policy": (64, 32, 4, "8-11"), **frozen}
    rollouts = 64 * 2 if stage == "opd" else 64 * 8
    assert (plan.train_ranks, plan.rollouts_per_step, plan.rollouts_per_update) == (64, rollouts, rollouts)
    assert plan.in_flight == rollouts  # rollout.num_workers covers the step
    assert plan.seqs_per_policy_replica == rollouts / 8
    # ZeRO-3 shards over the 64 ranks: bf16 params and grads, fp32 master, Adam m and v
    train = plan.mem("train")
    assert train.term("params").bytes == P * 2 / 64
    assert train.term("grads").bytes == P * 2 / 64
    assert train.term("fp32 master").bytes == P * 4 / 64
    assert train.term("Adam m, v").bytes == P * 8 / 64
    # gradient checkpointing keeps each layer's input for the whole packed row (28,672 + 4,096 tokens)
    assert train.term("checkpoints").bytes == 48 * (28_672 + 4_096) * 2048 * 2
    # the policy: bf16 weights over TP 4, one of the 4 KV heads per GPU, the rest of its pool is KV cache
    pol, fit = plan.mem("policy"), plan.engine("policy")
    assert pol.term("weights").bytes == P * 2 / 4
    assert fit.kv_bytes_per_token == 2 * 48 * 1 * 128 * 2
    assert pol.total == pytest.approx(0.85 * gb * 1e9)
    assert fit.seqs_fit == math.floor(pol.term("KV cache").bytes / (fit.kv_bytes_per_token * 32_768))
    assert fit.seqs_fit >= fit.seqs_assigned  # every rollout in flight holds its KV at full length
    for m in plan.memory:
        assert m.total <= gb * 1e9, m.role
    if stage == "opd":  # the teacher's prompt log-probs come on top of its 0.8 share
        teacher = plan.mem("teacher")
        logits = 16_384 * 120_832 * (2 + 4)
        assert teacher.term("prompt logprobs").bytes == logits
        assert teacher.total == pytest.approx(0.8 * gb * 1e9 + logits)
    else:  # TP 2: two KV heads per GPU
        assert plan.engine("reader").kv_bytes_per_token == 2 * 48 * 2 * 128 * 2
    text = format_plan(plan)
    assert "Placement" in text and "Memory per GPU" in text and "0-63" in text


def test_h200_holds_more_sequences_than_h20():
    h20, h200 = _plan("rl"), _plan("rl", "cluster=slurm_16x8_h200")
    assert h200.engine("policy").seqs_fit > h20.engine("policy").seqs_fit
    assert h200.mem("train").total == h20.mem("train").total  # the trainer's need does not change


def test_colocated_policy_shares_the_training_gpus():
    # no reader / judge here (external endpoints): train_gpus 0 takes all 128 GPUs, one policy replica per 4
    plan = _plan(
        "rl",
        "cluster.placement.mode=colocated",
        "cluster.placement.train_gpus=0",
        "cluster.placement.policy_replicas=0",
        "cluster.placement.reader.replicas=0",
        "cluster.placement.judge.replicas=0",
    )
    [pool] = plan.pools
    assert (pool.role, pool.num_gpus, pool.replicas, plan.train_ranks) == ("train+policy", 128, 32, 128)
    assert plan.seqs_per_policy_replica == 512 / 32
    pol = plan.mem("policy")  # awake, next to the trainer's resident shards
    shards = P * (2 + 2 + 4 + 8) / 128
    assert pol.term("trainer states").bytes == pytest.approx(shards + 4e9)
    assert pol.total <= 96e9
    with pytest.raises(PlanError, match=r"cluster\.placement\.policy_replicas=8: colocated"):
        _plan("rl", "cluster.placement.mode=colocated", "cluster.placement.train_gpus=64")


def test_cpu_box_plans_without_gpus():
    plan = make_plan(to_typed(compose("opd", ["+exp=demo_opd"]), OpdConfig))
    assert plan.pools == () and plan.memory == ()
    assert "CPU only" in format_plan(plan)


# ---- refusals: each names what does not fit ----------------------------------------------------------


def test_refuses_too_little_memory_for_the_trainer():
    # 4 ranks: the ZeRO-3 shards alone are 30.6B x 16 B / 4 = 122 GB per GPU
    with pytest.raises(PlanError, match="too little memory on a train GPU"):
        _plan("opd", "cluster.placement.train_gpus=4")


def test_refuses_an_engine_whose_kv_cache_holds_no_full_sequence():
    # TP 1: 61 GB of weights; at 0.7 x 96 GB the KV cache left holds less than one 32k sequence
    with pytest.raises(PlanError, match="too little memory for the policy: its KV cache"):
        _plan("rl", "engine.tensor_parallel_size=1", "engine.gpu_memory_utilization=0.7")


def test_refuses_an_engine_whose_weights_leave_no_kv_cache():
    # TP 1 at 0.6 x 96 GB: 61 GB of weights alone overflow the pool
    with pytest.raises(PlanError, match="too little memory for the policy: weights .* leave no KV cache"):
        _plan("rl", "engine.tensor_parallel_size=1", "engine.gpu_memory_utilization=0.6")


def test_refuses_a_gpu_cluster_without_its_memory_or_the_stage_models():
    with pytest.raises(PlanError, match=r"cluster\.gpu_memory_gb=0\.0: set the memory of one GPU"):
        _plan("rl", "cluster.gpu_memory_gb=0")
    with pytest.raises(PlanError, match=r"cluster\.placement\.teacher_replicas=0: OPD scores"):
        _plan("opd", "cluster.placement.teacher_replicas=0")
    with pytest.raises(PlanError, match=r"cluster\.placement\.policy_replicas=0: a GPU cluster serves"):
        _plan("rl", "cluster.placement.policy_replicas=0")


def test_refuses_a_batch_that_does_not_divide_over_the_ranks():
    with pytest.raises(PlanError, match="global batch does not divide over the trainer ranks"):
        _plan("rl", "cluster.placement.train_gpus=48")  # 512 rollouts over 48 ranks


def test_refuses_too_few_gpus():
    # OPD: 64 + 16 x 4 + 8 x 4 = 160 GPUs on a 128-GPU cluster
    with pytest.raises(PlanError, match="too few GPUs: .* = 160 GPUs"):
        _plan("opd", "cluster.placement.policy_replicas=16")


def test_refuses_a_tp_that_does_not_divide_a_node():
    # TP 16 shards the heads fine (32 / 16, 16 = 4 x 4 KV heads) but spans two 8-GPU nodes
    with pytest.raises(PlanError, match=r"engine\.tensor_parallel_size=16 does not divide"):
        _plan("rl", "engine.tensor_parallel_size=16", "cluster.placement.policy_replicas=1")


def test_refuses_a_replica_across_two_nodes():
    with pytest.raises(PlanError, match="policy pool starts at GPU 2 .* would span two nodes"):
        _plan("opd", "cluster.placement.train_gpus=2")


def test_refuses_gpu_pools_on_a_cpu_only_cluster():
    cfg = to_typed(compose("rl", ["+exp=demo_rl"]), RlConfig)
    cfg.cluster.placement.train_gpus = 2
    with pytest.raises(PlanError, match=r"cluster\.placement\.train_gpus=2: .* CPU-only cluster"):
        make_plan(cfg)
    # and the stage's own validation names the key before any work
    with pytest.raises(ValueError, match=r"cluster\.placement\.train_gpus=2: .* CPU-only"):
        to_typed(compose("rl", ["+exp=demo_rl", "cluster.placement.train_gpus=2"]), RlConfig)
    # policy, teacher, reader and judge replicas on a CPU box are CPU Ray actors (the multi-node simulation)
    cfg = to_typed(compose("opd", ["+exp=demo_opd", "cluster.placement.policy_replicas=2"]), OpdConfig)
    assert "2 policy replica(s) as CPU Ray actors" in format_plan(make_plan(cfg))
    cfg = to_typed(
        compose("rl", ["+exp=demo_rl", "reader_kind=model", "cluster.placement.reader.replicas=2"]),
        RlConfig,
    )
    assert "2 reader replica(s) as CPU Ray actors" in format_plan(make_plan(cfg))


def test_a_served_reader_or_judge_needs_its_checkpoint():
    from hymem_train.frozen_models import frozen_roles

    cfg = to_typed(compose("rl", ["+exp=demo_rl", "cluster.placement.judge.replicas=1"]), RlConfig)
    cfg.reward.judge_kind = "llm"
    with pytest.raises(ValueError, match=r"judge\.replicas=1: .* judge_model\.path must name its checkpoint"):
        frozen_roles(cfg)  # start_frozen_models asks this before it starts anything


def test_cli_prints_the_plan_and_exits_nonzero_on_refusal():
    # the experiment's '# primaries: rl' picks the stage: no --config-name needed
    ok = subprocess.run(
        [sys.executable, "-m", "hymem_train.plan", "+exp=hy_memory_rl", "cluster=slurm_16x8_h200"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "stage rl" in ok.stdout and "x 141 GB" in ok.stdout and "judge" in ok.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "hymem_train.plan",
            "--config-name",
            "opd",
            "+exp=hy_memory_opd",
            "cluster.placement.train_gpus=4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0
    assert "plan refused: too little memory on a train GPU" in bad.stderr


def test_notes_the_gateway_batch_cap_below_the_calls_in_flight():
    # vLLM's offline engine: 512 rollouts in flight but the gateway hands the engines 16 calls at a time
    # (the cost model's lever)
    text = format_plan(_plan("rl", "engine.async_engine=false"))
    assert "gateway.max_batch_size=16 < 512 calls in flight" in text
    big = _plan("rl", "engine.async_engine=false", "gateway.max_batch_size=512")
    assert "gateway.max_batch_size=16" not in format_plan(big)
    # the async engine (the default) takes each call as it arrives: the cap does not apply
    assert "gateway.max_batch_size" not in format_plan(_plan("rl"))
