"""Root configs of the entry points, composed from the component dataclasses (STYLE.md 3).

Each entry point has a primary `configs/<name>.yaml` and a schema here; `+exp=NAME` overlays from
`configs/exp/` change only what differs. Components add their own sections as they land (trainer,
data, harness, reward): a section is a dataclass next to the code it configures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from hymem_train.config import ClusterConfig, LoggingConfig, RunConfig
from hymem_train.engines import EngineConfig
from hymem_train.gateway.server import GatewayConfig
from hymem_train.models.loading import ModelConfig
from hymem_train.runtime import StageConfig
from reward.service import RewardConfig


@dataclass
class OpdAlgoConfig:
    num_rollouts_per_row: int = 2  # report: 2 student rollouts per data row
    teacher_top_k: int = 50  # report: reverse KL over the teacher's top-50 support
    num_rows_per_step: int = 64  # data rows per optimizer step


@dataclass
class RlAlgoConfig:
    num_rollouts_per_window: int = 8  # report: 8 rollouts from independent copies of the parent bank
    num_windows_per_step: int = 64  # report: 64 windows x 8 rollouts = 512 trajectories
    max_chunks_per_window: int = 5  # report: windows of at most 5 chunks
    init_from_opd_step: int = 375  # report: RL starts from OPD step 375
    # held-out evaluation: sampled rollouts of the first window of every eval sequence, from an empty bank
    # (the mean per-chunk score over few cells is noise: 3 sequences x 3 chunks x 2 rollouts moved by
    # one probe per cell)
    num_eval_rollouts: int = 2


@dataclass
class ServeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)  # the served policy
    engine: EngineConfig = field(default_factory=EngineConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    run: RunConfig = field(default_factory=RunConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def validate(self) -> None:
        self.model.validate(), self.engine.validate(), self.logging.validate()


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


@dataclass
class RlConfig(StageConfig):
    reward: RewardConfig = MISSING  # configs/reward/*.yaml (required)
    rl: RlAlgoConfig = field(default_factory=RlAlgoConfig)
    # CPU boxes: serve the frozen reader from a local HF engine (reward.reader.base_url is then set to it)
    local_reader: bool = False
    reader_model: ModelConfig = field(default_factory=ModelConfig)  # the frozen reader when local_reader

    def validate(self) -> None:
        super().validate()
        self.reward.validate()
        if self.trainer.loss.kind != "ppo":
            raise ValueError(f"trainer.loss.kind={self.trainer.loss.kind!r}: the RL stage needs 'ppo'")
        if self.rl.num_eval_rollouts < 1 or self.rl.num_rollouts_per_window < 2:
            raise ValueError(
                "rl.num_eval_rollouts must be >= 1 and rl.num_rollouts_per_window >= 2 (GRPO groups)"
            )
        missing = sorted(set(self.harnesses) - set(self.reward.scoring.growth_bounds))
        if missing:  # silent failure 4, caught before any work
            raise ValueError(f"reward.scoring.growth_bounds has no bounds for declared harness(es) {missing}")


@dataclass
class EvaluateConfig(ServeConfig):
    benchmarks: list[str] = field(
        default_factory=lambda: ["locomo", "longmemeval"]
    )  # report section: evaluation
    subsample_fraction: float = 0.2  # report: fixed 20% subsample
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


@dataclass
class ExportConfig:
    model: ModelConfig = field(default_factory=ModelConfig)  # what to export (path = a training checkpoint)
    checkpoint: str = "???"  # checkpoint directory written by sft/opd/rl
    out_dir: str = "???"  # HF-format output directory (config, safetensors, tokenizer)
    dtype: str = "bfloat16"  # dtype of the exported weights
    run: RunConfig = field(default_factory=RunConfig)
