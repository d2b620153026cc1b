"""The stage schemas: importing them costs no heavy import; training refuses a held-out harness;
logging.log_every thins the console and wandb, never metrics.jsonl."""

import json
import logging
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from hymem_train.config import LoggingConfig, compose, to_typed
from hymem_train.logger import MetricsLogger
from hymem_train.run_config import OpdConfig, RlConfig

HEAVY = ("torch", "ray", "fastapi", "uvicorn", "httpx", "openai", "deepspeed", "transformers")


def test_config_schemas_import_no_torch_ray_or_http_stack():
    code = (
        "import sys, hymem_train.run_config, hymem_train.sft; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # hymem_train.sft pulls in torch (it is an entry point); run_config alone must not
    assert "fastapi" not in out and "ray" not in out.split(",")
    code = f"import sys, hymem_train.run_config; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "", f"importing hymem_train.run_config imported {out.strip()}"


@pytest.mark.parametrize("primary,exp,schema", [("opd", "demo_opd", OpdConfig), ("rl", "demo_rl", RlConfig)])
def test_training_refuses_a_held_out_harness(primary, exp, schema):
    cfg = OmegaConf.create(OmegaConf.to_container(compose(primary, [f"+exp={exp}"])))  # untyped, to edit
    cfg.harnesses["everos"] = {"framework": "everos"}
    if primary == "rl":
        cfg.reward.scoring.growth_bounds["everos"] = {"lower": 1.0, "upper": 2.0}
    with pytest.raises(ValueError, match=r"harnesses\.everos: framework 'everos' is held out"):
        to_typed(cfg, schema)


def test_log_every_thins_console_and_keeps_every_step_in_jsonl(tmp_path, caplog):
    lg = MetricsLogger(LoggingConfig(wandb_mode="disabled", log_every=3), tmp_path, "t")
    with caplog.at_level(logging.INFO, logger="hymem_train.logger"):
        for step in range(1, 7):
            lg.log(step, {"train/loss": float(step)}, force=step == 1)
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == list(
        range(1, 7)
    )
    assert [r.getMessage() for r in caplog.records] == [
        "step 1 train/loss=1",
        "step 3 train/loss=3",
        "step 6 train/loss=6",
    ]


@pytest.mark.parametrize(
    "override, message",
    [
        ("cluster.placement.replica_strategy=SCATTER", r"cluster\.placement\.replica_strategy='SCATTER'"),
        ("cluster.placement.cpus_per_replica=0", r"cluster\.placement\.cpus_per_replica=0\.0: must be > 0"),
        ("rollout.max_worker_restarts=-1", r"rollout\.max_worker_restarts=-1: must be >= 0"),
        ("++rollout.ray_resources={rollout: 0}", r"rollout\.ray_resources=\{'rollout': 0\.0\}: every amount"),
        # rollout workers on another node cannot reach a loopback gateway (slurm/ passes gateway.host=auto)
        ("cluster.num_nodes=2", r"gateway\.host=127\.0\.0\.1 on cluster\.num_nodes=2"),
        # vLLM caps log-probs per position: a teacher below the top-k would fail at the first step
        (
            "teacher_engine.kind=vllm,teacher_engine.max_logprobs=20",
            r"teacher_engine\.max_logprobs=20 < opd\.teacher_top_k=50",
        ),
    ],
)
def test_replica_and_rollout_worker_knobs_are_validated(override, message):
    with pytest.raises(ValueError, match=message):
        to_typed(compose("opd", ["+exp=demo_opd", *override.split(",")]), OpdConfig)


@pytest.mark.parametrize(
    "override, message",
    [
        # the recomputed ratio is against the trainer's pre-update policy, not the stale one that sampled
        (
            "trainer.loss.ratio_source=recompute",
            r"rl\.overlap_rollout=true needs trainer\.loss\.ratio_source=rollout",
        ),
        ("rollout.mode=train_only", r"rl\.overlap_rollout=true overlaps .* rollout\.mode='train_only'"),
        # a sleeping engine cannot collect the next batch while the trainer steps
        (
            "cluster.placement.mode=colocated",
            r"rl\.overlap_rollout=true with cluster\.placement\.mode=colocated",
        ),
    ],
)
def test_overlapped_rollout_refuses_what_would_hide_its_lag(override, message):
    to_typed(compose("rl", ["+exp=demo_rl", "rl.overlap_rollout=true"]), RlConfig)  # the default combination
    with pytest.raises(ValueError, match=message):
        to_typed(compose("rl", ["+exp=demo_rl", "rl.overlap_rollout=true", override]), RlConfig)


def test_colocated_vllm_on_a_cpu_cluster_is_refused():
    """vLLM 0.32's CPU worker only logs a warning on sleep: the engine would keep its weights."""
    to_typed(compose("opd", ["+exp=demo_opd", "cluster.placement.mode=colocated"]), OpdConfig)  # HF: fine
    with pytest.raises(ValueError, match=r"colocated with engine\.kind=vllm on a CPU cluster"):
        to_typed(
            compose("opd", ["+exp=demo_opd", "cluster.placement.mode=colocated", "engine=vllm"]), OpdConfig
        )


def test_eval_every_thins_the_held_out_evaluation_not_the_checkpoints():
    cfg = to_typed(
        compose("rl", ["+exp=demo_rl", "num_steps=24", "save_every=12", "eval_every=24"]), RlConfig
    )
    assert [s for s in range(25) if cfg.evaluates_at(s)] == [0, 24]
    cfg = to_typed(compose("rl", ["+exp=demo_rl", "num_steps=10", "save_every=4", "eval_every=0"]), RlConfig)
    assert [s for s in range(11) if cfg.evaluates_at(s)] == [0, 4, 8, 10]  # 0: with every checkpoint
    with pytest.raises(ValueError, match="eval_every must be >= 0"):
        to_typed(compose("rl", ["+exp=demo_rl", "eval_every=-1"]), RlConfig)
