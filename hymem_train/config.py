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
from dataclasses import dataclass
from typing import Any

from data_pipeline.typed_config import (
    CONFIG_DIR,
    REPO_ROOT,
    ConfigError,
    RunConfig,
    compose,
    to_typed,
    to_yaml,
)

__all__ = [
    "CONFIG_DIR",
    "REPO_ROOT",
    "ClusterConfig",
    "ConfigError",
    "LoggingConfig",
    "RunConfig",
    "compose",
    "config_diff",
    "to_typed",
    "to_yaml",
]

# ---- sections the training entry points share (kept here: importing them must not pull in torch) ----


@dataclass
class ClusterConfig:
    num_nodes: int = 1  # nodes in the allocation (Slurm)
    num_gpus_per_node: int = 0  # 0 = CPU box
    ray_address: str = (
        "local"  # "local" = a new cluster here, whatever /tmp/ray holds; "auto" = join slurm/'s
    )
    num_cpus: int = 2  # CPUs Ray may use on a local start

    def validate(self) -> None:
        if self.num_nodes < 1 or self.num_gpus_per_node < 0:
            raise ValueError("cluster.num_nodes must be >= 1 and cluster.num_gpus_per_node >= 0")


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
