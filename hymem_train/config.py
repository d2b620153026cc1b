"""Configuration sections of the training entry points, and the typed Hydra mechanics they use.

The mechanics (`compose`, `to_typed`, `ConfigError`, `to_yaml`, `CONFIG_DIR`) and `RunConfig` live in
`data_pipeline.typed_config` (the lowest package that uses them: `python -m data_pipeline.build`) and
are re-exported here, so `from hymem_train.config import compose, to_typed` keeps working.

Usage in an entry point:

    @hydra.main(config_path=CONFIG_DIR, config_name="opd", version_base=None)
    def main(cfg): run(to_typed(cfg, OpdConfig))

and in tests / scripts: `to_typed(compose("opd", ["+exp=demo_cpu"]), OpdConfig)`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from data_pipeline.typed_config import (
    CONFIG_DIR,
    REPO_ROOT,
    ConfigError,
    RunConfig,
    compose,
    register_schema,
    to_typed,
    to_yaml,
)

__all__ = [
    "CONFIG_DIR",
    "REPO_ROOT",
    "ClusterConfig",
    "ConfigError",
    "LoggingConfig",
    "PlacementConfig",
    "RunConfig",
    "ServedModelPlacement",
    "compose",
    "config_diff",
    "register_schema",
    "to_typed",
    "to_yaml",
]

# ---- sections the training entry points share (kept here: importing them must not pull in torch) ----


PLACEMENT_MODES = ("split", "colocated")


@dataclass
class ServedModelPlacement:
    """A frozen model the RL reward service calls (reader or judge), served from this cluster's GPUs as
    vLLM replicas. The report does not name its reader or judge model: `model_preset` is only what
    `python -m hymem_train.plan` sizes the pool by."""

    replicas: int = 0  # vLLM replicas here (0 = served elsewhere: reward.*.base_url, or the CPU reader)
    tensor_parallel_size: int = 1  # GPUs per replica (within one node)
    gpu_memory_utilization: float = 0.85  # vLLM's share of each GPU (weights + activations + KV cache)
    max_model_len: int = 8192  # a probe or question with the retrieved memories, or a rubric and an answer
    model_preset: str = "hy_memory_30b_a3b"  # architecture the plan sizes it by (models/presets.py)

    def validate(self, key: str) -> None:
        if self.replicas < 0 or self.tensor_parallel_size < 1 or self.max_model_len < 2:
            raise ValueError(
                f"{key}: replicas={self.replicas} must be >= 0, tensor_parallel_size="
                f"{self.tensor_parallel_size} >= 1, max_model_len={self.max_model_len} >= 2"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"{key}.gpu_memory_utilization={self.gpu_memory_utilization}: want (0, 1]")


@dataclass
class PlacementConfig:
    """Which GPUs each device process owns (docs/cluster.md, "Placement"). Pools are laid out in this
    order over the global GPU index (node-major): train, policy, then the stage's frozen models (OPD:
    teacher; RL: reader, judge). A stage ignores the pools of the other stage, so one cluster file
    serves both. Replica sizes come from the engines: engine.tensor_parallel_size (policy),
    teacher_engine.tensor_parallel_size (OPD teacher), reader/judge.tensor_parallel_size here."""

    # split: training ranks and policy replicas on separate GPUs (weights sync over the network);
    # colocated: the policy replicas share the training GPUs and sleep while the trainer steps
    mode: str = "split"
    train_gpus: int = 0  # GPUs of the training ranks, one rank each; 0 = every GPU the other pools leave
    policy_replicas: int = 0  # split: vLLM policy replicas; colocated: 0 (= train_gpus / TP) or that number
    teacher_replicas: int = 0  # OPD: vLLM replicas of the frozen teacher (its own GPUs in both modes)
    # On a CPU box (num_gpus_per_node=0) policy / teacher / reader / judge replicas are HF engine replicas as
    # CPU Ray actors (0: the engine in the driver process); the simulated multi-node tests use them.
    cpus_per_replica: float = 1.0  # Ray CPUs per engine replica actor (its host process)
    # Ray placement-group strategy of a replica pool: PACK fills nodes (TP groups and their NVLink stay in
    # a node either way: one bundle is one node); SPREAD / STRICT_SPREAD put replicas on distinct nodes
    replica_strategy: str = "PACK"
    reader: ServedModelPlacement = field(default_factory=ServedModelPlacement)  # RL: the frozen reader
    judge: ServedModelPlacement = field(default_factory=ServedModelPlacement)  # RL: the frozen judge

    def gpu_requests(self) -> dict[str, int]:
        """Every count that asks for GPUs, by its key (a CPU box must ask for none)."""
        return {
            "cluster.placement.train_gpus": self.train_gpus,
            "cluster.placement.policy_replicas": self.policy_replicas,
            "cluster.placement.teacher_replicas": self.teacher_replicas,
            "cluster.placement.reader.replicas": self.reader.replicas,
            "cluster.placement.judge.replicas": self.judge.replicas,
        }

    def validate(self) -> None:
        if self.mode not in PLACEMENT_MODES:
            raise ValueError(f"cluster.placement.mode={self.mode!r}: want one of {PLACEMENT_MODES}")
        strategies = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
        if self.replica_strategy not in strategies:
            raise ValueError(
                f"cluster.placement.replica_strategy={self.replica_strategy!r}: want one of {strategies}"
            )
        if self.cpus_per_replica <= 0:
            raise ValueError(f"cluster.placement.cpus_per_replica={self.cpus_per_replica}: must be > 0")
        for key, n in self.gpu_requests().items():
            if n < 0:
                raise ValueError(f"{key}={n}: must be >= 0")
        self.reader.validate("cluster.placement.reader")
        self.judge.validate("cluster.placement.judge")


@dataclass
class ClusterConfig:
    num_nodes: int = 1  # nodes in the allocation (Slurm)
    num_gpus_per_node: int = 0  # 0 = CPU box
    ray_address: str = (
        "local"  # "local" = a new cluster here, whatever /tmp/ray holds; "auto" = join slurm/'s
    )
    num_cpus: int = 2  # CPUs Ray may use on a local start
    gpu_memory_gb: float = 0.0  # memory of one GPU (1 GB = 1e9 bytes; H20: 96, H200: 141); 0 = no GPUs
    placement: PlacementConfig = field(default_factory=PlacementConfig)  # which GPUs each process owns
    # Ray actors' stdout/stderr (rollout workers, reward actors, engine replicas): printed by the driver
    # (true), or left in Ray's session logs, whose path the stage logs at start (false: the default,
    # the driver's own log stays readable with hundreds of actors)
    log_to_driver: bool = False
    dashboard: bool = False  # local start: Ray's dashboard on 127.0.0.1:8265 (needs ray[default])

    def validate(self) -> None:
        if self.num_nodes < 1 or self.num_gpus_per_node < 0:
            raise ValueError("cluster.num_nodes must be >= 1 and cluster.num_gpus_per_node >= 0")
        if self.gpu_memory_gb < 0:
            raise ValueError(f"cluster.gpu_memory_gb={self.gpu_memory_gb}: must be >= 0")
        self.placement.validate()
        if self.num_gpus_per_node == 0:
            # a CPU box: trainer ranks as torchrun starts them; policy/teacher replicas, if asked for, are
            # CPU Ray actors (HF engines: the multi-node simulation), and so are reader / judge pools
            cpu_ok = (
                "cluster.placement.policy_replicas",
                "cluster.placement.teacher_replicas",
                "cluster.placement.reader.replicas",
                "cluster.placement.judge.replicas",
            )
            asked = {k: n for k, n in self.placement.gpu_requests().items() if n > 0 and k not in cpu_ok}
            if asked:
                raise ValueError(
                    f"{', '.join(f'{k}={n}' for k, n in asked.items())}: cluster.num_gpus_per_node=0 "
                    "is a CPU-only cluster, it has no GPUs to place them on"
                )


@dataclass
class LoggingConfig:
    wandb_mode: str = "offline"  # offline (default: no network) | online | disabled
    project: str = "hymem-train"  # wandb project
    entity: str = ""  # wandb entity; empty = the user's default
    log_every: int = 1  # optimizer steps between metric logs

    def validate(self) -> None:
        if self.wandb_mode not in ("offline", "online", "disabled"):
            raise ValueError(f"logging.wandb_mode must be offline/online/disabled, got {self.wandb_mode!r}")


def config_diff(a: Any, b: Any, *, atomic: tuple[str, ...] = ()) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (value in a, value in b) for every leaf where two typed configs differ. A key in
    `atomic` (e.g. "harnesses") is compared whole: a changed harness set is one difference."""
    from omegaconf import OmegaConf

    def plain(x):
        return OmegaConf.to_container(OmegaConf.structured(x)) if dataclasses.is_dataclass(x) else x

    out: dict[str, tuple[Any, Any]] = {}

    def walk(x, y, prefix: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict) and prefix.rstrip(".") not in atomic:
            for k in sorted(set(x) | set(y), key=str):
                walk(x.get(k), y.get(k), f"{prefix}{k}.")
        elif x != y:
            out[prefix.rstrip(".")] = (x, y)

    walk(plain(a), plain(b), "")
    return out
