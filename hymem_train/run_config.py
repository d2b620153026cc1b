"""Root configs of the entry points, composed from the component dataclasses.

Each entry point has a primary `configs/<name>.yaml` and a schema here; `+exp=NAME` overlays from
`configs/exp/` change only what differs. Every component's dataclass lives in a `config` module
next to its code that imports no torch, Ray or HTTP stack, so composing and validating a run
(`tests/config`, a preflight) costs no heavy import (tests/config/test_config_imports.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from omegaconf import MISSING

from harnesses.registry import HarnessConfig, get_spec
from hymem_train.config import ClusterConfig, ConfigError, LoggingConfig, RunConfig, register_schema
from hymem_train.engines.config import EngineConfig
from hymem_train.evaluation.config import MatrixConfig, StageSwapEval
from hymem_train.gateway.config import GatewayConfig
from hymem_train.models.config import DTYPE_NAMES, ModelConfig
from hymem_train.rollout.config import RolloutConfig
from hymem_train.trainer.config import TrainerConfig
from reward.config import RewardConfig
from reward.schedule import reconcile_data


@dataclass
class DataRef:
    """The training data: `per_harness` (each harness configuration trains on every sequence of its own
    dataset) or `path`, the single-dataset shorthand (one dataset, each sequence bound to one harness
    round-robin). Exactly one of the two (docs/stages.md, "Data per harness")."""

    path: str = ""  # a built dataset directory (python -m data_pipeline.build), one harness profile
    # harness config name -> its built dataset directory (report: Chat, Mem0 and MemOS each process the
    # same windows, each with its own chunking profile; Working and Coding have their own data)
    per_harness: dict[str, str] = field(default_factory=dict)
    eval_path: str = ""  # held-out built dataset for evaluation ("" = none)
    # keep the probes and ORM questions reward.leakage found answerable from an empty bank (default: dropped)
    keep_leaked: bool = False

    def validate(self, declared: list[str]) -> None:
        if bool(self.path) == bool(self.per_harness):
            raise ConfigError(
                "data.path / data.per_harness: set exactly one (data.path=DIR: one built dataset for every "
                "harness; data.per_harness.<harness>=DIR: a dataset per harness configuration)"
            )
        if self.per_harness and declared:  # silent failure harness-unscheduled, caught before any work
            reconcile_data(self.per_harness, declared, where="data.per_harness")


@dataclass
class StageConfig:
    """Fields both training stages share; OpdConfig / RlConfig add theirs."""

    trainer: TrainerConfig  # configs/trainer/{opd,rl}.yaml
    model: ModelConfig = field(default_factory=ModelConfig)  # the policy (student)
    engine: EngineConfig = field(default_factory=EngineConfig)  # rollout engine behind the gateway
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    # the declared harness set (name -> config); the schedule manifest is reconciled against it
    harnesses: dict[str, HarnessConfig] = field(default_factory=dict)
    data: DataRef = field(default_factory=DataRef)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    run: RunConfig = field(default_factory=RunConfig)
    num_steps: int = 100  # optimizer steps of this stage
    save_every: int = 10  # checkpoint every N steps, and at the end
    # held-out evaluation (data.eval_path) at step 0, every N steps and at the end; 0 = every save_every
    eval_every: int = 0
    # the policy's start: an HF directory (<run>/final) or a DeepSpeed step checkpoint
    # (<run>/checkpoints/step_N, architecture from that run's config.yaml); "" = model config
    init_checkpoint: str = ""
    swap_eval: StageSwapEval = field(default_factory=StageSwapEval)  # the writer-swap matrix every N steps

    def evaluates_at(self, step: int) -> bool:
        """The held-out evaluation's schedule: step 0 (the start), every eval_every steps (0: every
        save_every) and the last step."""
        return step % (self.eval_every or self.save_every) == 0 or step == self.num_steps

    def validate(self) -> None:
        self.data.validate(list(self.harnesses))
        self.swap_eval.validate(list(self.harnesses), has_reader=hasattr(self, "reward"))
        if self.swap_eval.every and not (self.swap_eval.data or self.data.eval_path):
            raise ValueError("swap_eval.every > 0 needs swap_eval.data or data.eval_path (a built dataset)")
        self.model.validate(), self.engine.validate(), self.trainer.validate(), self.rollout.validate()
        self.cluster.validate(), self.logging.validate(), self.gateway.validate()
        self.gateway.check_fits(self.engine.max_model_len)
        if not self.harnesses:
            raise ValueError("harnesses: declare at least one harness configuration")
        for name, h in self.harnesses.items():
            h.validate()
            if get_spec(h.framework, h.scene).held_out:  # report: EverMemOS is evaluation-only
                raise ValueError(
                    f"harnesses.{name}: framework {h.framework!r} is held out (evaluation only); "
                    "a training stage refuses it"
                )
        if self.num_steps < 1 or self.save_every < 1:
            raise ValueError("num_steps and save_every must be >= 1")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0 (0 = every save_every), got {self.eval_every}")
        if (
            self.cluster.placement.mode == "colocated"
            and self.engine.kind == "vllm"
            and not self.cluster.num_gpus_per_node
        ):
            raise ValueError(
                "cluster.placement.mode=colocated with engine.kind=vllm on a CPU cluster: vLLM 0.32's CPU worker "
                "ignores sleep, so the engine would keep its weights while the trainer steps; use engine.kind=hf"
            )
        if self.cluster.num_nodes > 1 and self.rollout.use_ray and self.gateway.host in LOOPBACK:
            raise ValueError(
                f"gateway.host={self.gateway.host} on cluster.num_nodes={self.cluster.num_nodes}: rollout workers "
                "on the other nodes cannot reach a loopback gateway; gateway.host=auto binds the driver "
                "node's address (slurm/ray_job.sbatch passes it)"
            )


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def ray_cpu_demand(cfg: StageConfig) -> float:
    """CPUs the stage's Ray actors reserve: rollout workers, engine replica actors, plus the reward actors
    of every harness (RL)."""
    demand = cfg.rollout.num_workers * cfg.rollout.num_cpus_per_worker if cfg.rollout.use_ray else 0.0
    pl = cfg.cluster.placement
    replicas = pl.policy_replicas + (pl.teacher_replicas if hasattr(cfg, "opd") else 0)
    if hasattr(cfg, "reward"):  # RL's frozen pools (frozen_models.start_frozen_models)
        replicas += pl.reader.replicas + (pl.judge.replicas if cfg.reward.judge_kind == "llm" else 0)
    demand += replicas * pl.cpus_per_replica
    reward = getattr(cfg, "reward", None)
    if reward is not None:
        demand += len(cfg.harnesses) * reward.num_actors * reward.num_cpus_per_actor
    return demand


@dataclass
class OpdAlgoConfig:
    num_rollouts_per_row: int = 2  # report: 2 student rollouts per data row
    teacher_top_k: int = 50  # report: reverse KL over the teacher's top-50 support
    num_rows_per_step: int = 64  # data rows per optimizer step


@dataclass
class RlAlgoConfig:
    num_rollouts_per_window: int = 8  # report: 8 rollouts from independent copies of the parent bank
    num_windows_per_step: int = 64  # report: 64 windows x 8 rollouts = 512 trajectories
    # held-out evaluation: sampled rollouts of the first window of every eval sequence, from an empty
    # bank (few cells make the mean per-chunk score noisy: docs/stages.md)
    num_eval_rollouts: int = 2
    # beyond the report (synchronous): collect step k+1's rollouts while step k trains, one policy
    # version stale; needs trainer.loss.ratio_source=rollout so the PPO clip sees the staleness
    overlap_rollout: bool = False


@dataclass
class ServeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)  # the served policy
    engine: EngineConfig = field(default_factory=EngineConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    run: RunConfig = field(default_factory=RunConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def validate(self) -> None:
        self.model.validate(), self.engine.validate(), self.logging.validate(), self.gateway.validate()
        self.gateway.check_fits(self.engine.max_model_len)


@dataclass
class OpdConfig(StageConfig):
    teacher: ModelConfig = field(default_factory=lambda: ModelConfig(preset="tiny_teacher"))  # frozen teacher
    teacher_engine: EngineConfig = field(default_factory=lambda: EngineConfig(capture_routes=False))
    opd: OpdAlgoConfig = field(default_factory=OpdAlgoConfig)

    def validate(self) -> None:
        super().validate()
        self.teacher.validate(), self.teacher_engine.validate()
        if self.trainer.loss.kind != "opd":
            raise ValueError(f"trainer.loss.kind={self.trainer.loss.kind!r}: the OPD stage needs 'opd'")
        if self.teacher_engine.kind == "vllm" and self.teacher_engine.max_logprobs < self.opd.teacher_top_k:
            raise ValueError(
                f"teacher_engine.max_logprobs={self.teacher_engine.max_logprobs} < opd.teacher_top_k="
                f"{self.opd.teacher_top_k}: vLLM would refuse the teacher's top-k at the first step"
            )


@dataclass
class RlConfig(StageConfig):
    reward: RewardConfig = MISSING  # configs/reward/*.yaml (required)
    rl: RlAlgoConfig = field(default_factory=RlAlgoConfig)
    # CPU boxes: serve the frozen reader from a local HF engine (reward.reader.base_url is then set to it)
    local_reader: bool = False
    # the frozen reader / judge when the stage serves them (local_reader, or cluster.placement.reader /
    # .judge replicas > 0); a training run's checkpoint is exported for a vLLM pool (<run>/<role>_hf)
    reader_model: ModelConfig = field(default_factory=ModelConfig)
    judge_model: ModelConfig = field(default_factory=ModelConfig)
    reader_kind: str = "model"  # the local reader: "model" (reader_model) or an instrument (READER_KINDS)
    # ledger-world data: check the reader reads the bank before step 0 (reward.reader_checks)
    reader_preflight: bool = True

    def validate(self) -> None:
        super().validate()
        self.reward.validate()
        check_reader_kind(self.reader_kind, self.local_reader, self.cluster.placement.reader.replicas)

        if self.trainer.loss.kind != "ppo":
            raise ValueError(f"trainer.loss.kind={self.trainer.loss.kind!r}: the RL stage needs 'ppo'")
        if self.rl.num_eval_rollouts < 1 or self.rl.num_rollouts_per_window < 2:
            raise ValueError(
                "rl.num_eval_rollouts must be >= 1 and rl.num_rollouts_per_window >= 2 (GRPO groups)"
            )
        if self.rl.overlap_rollout and self.trainer.loss.ratio_source != "rollout":
            # "recompute" takes the ratio against the pre-update trainer policy, which is not the
            # one that sampled a stale batch: the off-policy step would go uncorrected
            raise ValueError(
                "rl.overlap_rollout=true needs trainer.loss.ratio_source=rollout (the engine's log-probs are "
                f"the stale policy's; {self.trainer.loss.ratio_source!r} would hide the lag from the PPO clip)"
            )
        if self.rl.overlap_rollout and self.cluster.placement.mode == "colocated":
            raise ValueError(
                "rl.overlap_rollout=true with cluster.placement.mode=colocated: the colocated engine sleeps "
                "while the trainer steps, so it cannot collect the next batch then; use split placement"
            )
        if self.rl.overlap_rollout and self.rollout.mode != "train":
            raise ValueError(
                f"rl.overlap_rollout=true overlaps rollouts with training: rollout.mode="
                f"{self.rollout.mode!r} does one of them only; want rollout.mode=train"
            )
        missing = sorted(set(self.harnesses) - set(self.reward.scoring.growth_bounds))
        if missing:  # silent failure harness-unscheduled, caught before any work
            raise ValueError(f"reward.scoring.growth_bounds has no bounds for declared harness(es) {missing}")


# "model": reader_model; the instruments (hymem_train/engines/instrument.py INSTRUMENTS): "extractive"
# (reward.instrument, the ledger world's grammar) and "lexical" (reward.lexical, real-data banks)
READER_KINDS = ("model", "extractive", "lexical")


def check_reader_kind(kind: str, local_reader: bool, replicas: int = 0) -> None:
    """`reader_kind`: an instrument reader has no checkpoint, so only this process can serve it."""
    if kind not in READER_KINDS:
        raise ValueError(f"reader_kind={kind!r}: want one of {READER_KINDS}")
    if kind != "model" and (not local_reader or replicas):
        raise ValueError(
            f"reader_kind={kind} is served in this process (no model to place): set local_reader=true"
            + (f" and cluster.placement.reader.replicas=0 (got {replicas})" if replicas else "")
        )


@dataclass
class EvaluateConfig(MatrixConfig):
    """`python -m hymem_train.evaluate`: the writer-only swap matrix (hymem_train/evaluation/config.py holds
    the matrix itself; docs/evaluation.md)."""

    # architecture and tokenizer of checkpoint writers (a step checkpoint's run config.yaml wins)
    model: ModelConfig = field(default_factory=ModelConfig)
    # the engine that serves checkpoint writers (frozen: no routes captured)
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(capture_routes=False))
    gateway: GatewayConfig = field(default_factory=lambda: GatewayConfig(frozen=True, embeddings=False))
    # CPU boxes: serve the fixed reader / judge from local HF engines (their base_url is then set)
    local_reader: bool = False
    reader_model: ModelConfig = field(default_factory=ModelConfig)
    reader_kind: str = "model"  # the local reader: "model" (reader_model) or an instrument (READER_KINDS)
    # ledger-world data: check the reader reads the bank before the matrix runs (reward.reader_checks)
    reader_preflight: bool = True
    local_judge: bool = False
    judge_model: ModelConfig = field(default_factory=ModelConfig)
    run: RunConfig = field(default_factory=RunConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def validate(self) -> None:
        super().validate()
        self.model.validate(), self.engine.validate(), self.gateway.validate()
        check_reader_kind(self.reader_kind, self.local_reader)
        if not self.local_reader and not self.protocol.reader.base_url:
            raise ValueError("protocol.reader.base_url: set the fixed reader endpoint (or local_reader=true)")
        # the judge endpoint is checked once the data says a benchmark needs one (synthetic data does not)


@dataclass
class ExportConfig:
    """`python -m hymem_train.export checkpoint=... out_dir=...` (docs/export.md)."""

    # a DeepSpeed step checkpoint (<run>/checkpoints/step_N, or <run>/checkpoints = its `latest`) or an
    # HF directory (<run>/final); a step checkpoint's architecture comes from <run>/config.yaml
    checkpoint: str = "???"
    out_dir: str = "???"  # HF-format output: safetensors shards, config, tokenizer, generation config, card
    dtype: str = "bfloat16"  # exported weights (router gate and expert bias stay float32, as HF keeps them)
    # the architecture when the checkpoint's run has no config.yaml (an SFT run); otherwise unused
    model: ModelConfig = field(default_factory=ModelConfig)
    max_shard_mb: int = 5000  # safetensors shard size (MB = 10^6 bytes)
    served_model_name: str = "hy-memory"  # written into the card's `vllm serve` line
    push_to_hub: str = ""  # "owner/name": upload out_dir with huggingface_hub after the export ("" = no)
    run: RunConfig = field(default_factory=RunConfig)

    def validate(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype {self.dtype!r} not in {sorted(DTYPE_NAMES)}")
        if self.max_shard_mb < 1:
            raise ValueError(f"max_shard_mb={self.max_shard_mb}: must be >= 1")
        if self.push_to_hub and not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", self.push_to_hub):
            raise ValueError(f"push_to_hub={self.push_to_hub!r}: want a Hub repo id 'owner/name'")


# each primary config (configs/<name>.yaml) is composed onto its schema's defaults
for _primary, _schema in (
    ("opd", OpdConfig),
    ("rl", RlConfig),
    ("serve", ServeConfig),
    ("evaluate", EvaluateConfig),
    ("export", ExportConfig),
):
    register_schema(_primary, _schema)
