"""Typed Hydra configuration mechanics: compose, to_typed, ConfigError, to_yaml.

Hydra composes the YAML (`configs/<primary>.yaml` + groups + `+exp=NAME` overlays) onto the entry
point's dataclass schema, which the schema's module registers in Hydra's ConfigStore
(`register_schema`) and the primary names first in its defaults list (`- opd_schema`). So the YAML
holds only what differs from the defaults, every field takes a plain `key=value` override, and a wrong
key or a wrong type fails at composition, before any work, with the dotted key in the message. Each component's dataclass lives next to the
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
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

REPO_ROOT = Path(__file__).resolve().parent.parent  # the repository root (configs/ lives there)
CONFIG_DIR = str(REPO_ROOT / "configs")
T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration that does not match its schema; the message names the dotted key."""


def schema_name(primary: str) -> str:
    """The ConfigStore entry that configs/<primary>.yaml names first in its defaults list."""
    return f"{primary}_schema"


def register_schema(primary: str, schema: type) -> None:
    """Make the dataclass `schema` the base of configs/<primary>.yaml. Hydra then composes the YAML onto
    the typed defaults: a YAML holds only what differs from them, `key=value` reaches every schema field
    (a key that is not one is refused with its name), and a wrong type fails at composition."""
    if not dataclasses.is_dataclass(schema):
        raise TypeError(f"schema {schema!r} is not a dataclass")
    ConfigStore.instance().store(name=schema_name(primary), node=schema)


def compose(primary: str, overrides: list[str] | None = None, config_dir: str = CONFIG_DIR) -> DictConfig:
    """Compose `configs/<primary>.yaml` with Hydra's compose API (no working-dir change, no logging setup).
    The primary's schema must be registered: importing the module that defines it does that."""
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        try:
            return hydra_compose(config_name=primary, overrides=list(overrides or []))
        except MissingConfigException as e:
            if schema_name(primary) not in str(e):
                raise
            raise ConfigError(
                f"configs/{primary}.yaml is composed onto the schema {schema_name(primary)!r}, which is not "
                "registered: import the module that defines it (register_schema)"
            ) from None
        except ConfigCompositionException as e:  # an override the schema refuses: unknown key, wrong type
            cause = str(e.__cause__).splitlines()[0] if e.__cause__ else ""
            hint = ""
            if (
                "is not a subclass of" in cause
            ):  # OmegaConf cannot assign a plain dict to a typed dict's new key
                hint = "; a new entry of a typed dict is added from its parent: +PARENT={NAME: {...}}"
            raise ConfigError(f"{primary}: {e}" + (f": {cause}" if cause else "") + hint) from None


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
