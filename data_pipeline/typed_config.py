"""Typed Hydra configuration mechanics: compose, to_typed, ConfigError, to_yaml.

Hydra composes the YAML (`configs/<primary>.yaml` + groups + `+exp=NAME` overlays); the result is
merged into the entry point's dataclass schema, so a wrong key or a wrong type fails at start-up,
before any work, with the dotted key in the message. Each component's dataclass lives next to the
class it configures; this module only holds the mechanics and the `run` section every entry point
shares. It lives in data_pipeline, the lowest package with a Hydra entry point
(`python -m data_pipeline.build`); `hymem_train.config` re-exports it (docs/architecture.md).

Usage in an entry point:

    @hydra.main(config_path=CONFIG_DIR, config_name="opd", version_base=None)
    def main(cfg): run(to_typed(cfg, OpdConfig))

and in tests / scripts: `to_typed(compose("opd", ["+exp=demo_cpu"]), OpdConfig)`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

REPO_ROOT = Path(__file__).resolve().parent.parent  # the repository root (configs/ lives there)
CONFIG_DIR = str(REPO_ROOT / "configs")
T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration that does not match its schema; the message names the dotted key."""


def compose(primary: str, overrides: list[str] | None = None, config_dir: str = CONFIG_DIR) -> DictConfig:
    """Compose `configs/<primary>.yaml` with Hydra's compose API (no working-dir change, no logging setup)."""
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name=primary, overrides=list(overrides or []))


def to_typed(cfg: DictConfig | dict[str, Any], schema: type[T]) -> T:
    """Validate `cfg` against the dataclass `schema` and return a schema instance.

    Unknown keys, wrong types and missing required values raise ConfigError naming the key.
    Hydra's own bookkeeping node (`hydra`) is dropped first.
    """
    if not dataclasses.is_dataclass(schema):
        raise TypeError(f"schema {schema!r} is not a dataclass")
    if isinstance(cfg, DictConfig):
        raw = OmegaConf.to_container(cfg, resolve=True)
    else:
        raw = dict(cfg)
    assert isinstance(raw, dict)
    raw.pop("hydra", None)
    try:
        base = OmegaConf.structured(schema)
        merged = OmegaConf.merge(base, raw)
        OmegaConf.resolve(merged)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(f"{schema.__name__}: required config value(s) missing: {', '.join(missing)}")
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        msg = str(e).splitlines()[0]
        raise ConfigError(f"{schema.__name__}: bad config at key '{key}': {msg}") from None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj  # type: ignore[return-value]


def to_yaml(obj: Any) -> str:
    """The resolved config of a run, for the run directory (what was actually used)."""
    return OmegaConf.to_yaml(OmegaConf.structured(obj))


# ---- the section every entry point shares (importing it must not pull in torch) ----


@dataclass
class RunConfig:
    name: str = "run"  # run name (wandb, run directory)
    output_dir: str = "runs/${run.name}"  # run directory: checkpoints, banks, dumps, plots
    seed: int = 0  # global seed (data order, sampling, init)
