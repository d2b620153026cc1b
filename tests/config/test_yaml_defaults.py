"""Each primary config is composed onto its dataclass schema (registered in Hydra's ConfigStore), so a
YAML holds only what differs from the defaults: a repeated default hides which values are choices and
drifts when the default changes. Every key of the schema can still be overridden on the command line.

Checked here: the primaries (against their schema) and every config-group option (against the schema
node at each place a primary or an overlay mounts it). Experiment overlays are not checked: an overlay
may restate a default to undo what its base set."""

import dataclasses
import functools
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from data_pipeline.build import DataBuildConfig
from data_pipeline.typed_config import ConfigError, compose
from hymem_train.config import CONFIG_DIR
from hymem_train.run_config import EvaluateConfig, ExportConfig, OpdConfig, RlConfig, ServeConfig
from hymem_train.sft import SftConfig

CONFIGS = Path(CONFIG_DIR)
SCHEMAS = {
    "opd": OpdConfig,
    "rl": RlConfig,
    "serve": ServeConfig,
    "evaluate": EvaluateConfig,
    "export": ExportConfig,
    "sft": SftConfig,
    "data_build": DataBuildConfig,
}
_MISSING = object()
# `- group@package: option` in a primary, `- /group@package: option` or `- override /group: option` in an overlay
_ENTRY = re.compile(r"^  - (?:override )?/?(\w+)(?:@([\w.]+))?: \w+", re.M)


@functools.cache
def _tree(schema: type) -> Any:
    """The schema's defaults as plain containers (read only)."""
    return OmegaConf.to_container(OmegaConf.structured(schema), resolve=False)


def _node_default(schema: type, path: list[str]) -> Any:
    """The schema's default at a dotted path (a dataclass-typed field without a default: its type's
    defaults; a dict of dataclasses: the value type's defaults), or _MISSING where the path leaves it."""
    node: Any = _tree(schema)
    typ: Any = schema
    for key in path:
        hint = None
        if dataclasses.is_dataclass(typ):
            hint = typing.get_type_hints(typ).get(key)
            if hint is None:
                return _MISSING
        elif not (isinstance(typ, tuple) and typ[0] == "dict"):
            return _MISSING
        if node == "???" and dataclasses.is_dataclass(typ):  # a required section: its type's own defaults
            node = _tree(typ)
        if isinstance(typ, tuple):  # a name inside dict[str, Dataclass]
            node = node.get(key, _tree(typ[1]))
            typ = typ[1]
            continue
        if not isinstance(node, dict) or key not in node:
            return _MISSING
        node = node[key]
        if dataclasses.is_dataclass(hint):
            typ = hint
        elif typing.get_origin(hint) is dict and dataclasses.is_dataclass(typing.get_args(hint)[1]):
            typ = ("dict", typing.get_args(hint)[1])
            node = node if isinstance(node, dict) else {}
        else:
            typ = None
    return node


def _leaves(node: dict, prefix: list[str]):
    for key, value in node.items():
        if not prefix and key in ("defaults", "hydra"):
            continue
        if isinstance(value, dict) and value:
            yield from _leaves(value, prefix + [key])
        else:
            yield prefix + [key], value


def _same(a: Any, b: Any) -> bool:
    numbers = (int, float)
    if (
        isinstance(a, numbers)
        and isinstance(b, numbers)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return float(a) == float(b)
    return type(a) is type(b) and a == b


@functools.cache
def _mounts() -> dict[str, set[tuple[type, str]]]:
    """group -> {(primary schema, package path)} over every primary and overlay that mounts it."""
    out: dict[str, set[tuple[type, str]]] = {}
    sources = [(CONFIGS / f"{p}.yaml", [p]) for p in SCHEMAS]
    for overlay in sorted((CONFIGS / "exp").glob("*.yaml")):
        m = re.search(r"^# primaries: (.+)$", overlay.read_text(), re.M)
        sources.append((overlay, m.group(1).split() if m else []))
    for path, primaries in sources:
        for group, package in _ENTRY.findall(path.read_text()):
            if (CONFIGS / group).is_dir():
                for p in primaries:
                    out.setdefault(group, set()).add((SCHEMAS[p], package or group))
    return out


def repeated_defaults(rel: str) -> list[str]:
    """Dotted keys of configs/<rel> whose value equals the schema default everywhere the file lands."""
    data = OmegaConf.to_container(OmegaConf.load(CONFIGS / rel)) or {}
    parts = Path(rel).parts
    if len(parts) == 1:
        places = [(SCHEMAS[Path(rel).stem], "")]
    else:
        places = sorted(_mounts().get(parts[0], ()), key=str)
        assert places, f"configs/{rel}: no primary or overlay mounts the group {parts[0]!r}"
    out = []
    for path, value in _leaves(data, []):
        defaults = [
            _node_default(schema, (mount.split(".") if mount else []) + path) for schema, mount in places
        ]
        if all(d is not _MISSING and _same(d, value) for d in defaults):
            out.append(".".join(path))
    return out


CHECKED = [f"{p}.yaml" for p in SCHEMAS] + sorted(
    str(p.relative_to(CONFIGS)) for p in CONFIGS.glob("*/*.yaml") if p.parent.name != "exp"
)


@pytest.mark.parametrize("rel", CHECKED)
def test_yaml_repeats_no_schema_default(rel):
    repeated = repeated_defaults(rel)
    assert not repeated, (
        f"configs/{rel} repeats its schema's default of: {', '.join(repeated)}; drop the line"
    )


def test_the_check_catches_a_repeated_default(tmp_path, monkeypatch):
    # a group option mounted as `model` and `teacher`: equal to the default at both places, or not
    assert _node_default(OpdConfig, ["trainer", "weight_decay"]) == 0.0
    assert _node_default(RlConfig, ["reward", "scoring", "use_traps"]) is True
    assert _node_default(RlConfig, ["reward", "scoring", "growth_bounds", "native", "floor_tokens"]) == 2048
    assert _node_default(OpdConfig, ["harnesses", "native", "num_retries"]) == 1
    assert _node_default(OpdConfig, ["trainer", "no_such_key"]) is _MISSING
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "opd.yaml").write_text("lr: 1.0e-6\nweight_decay: 0.0\nloss:\n  clip_low: 0.2\n")
    monkeypatch.setitem(globals(), "CONFIGS", tmp_path)
    monkeypatch.setitem(
        globals(), "_mounts", lambda: {"trainer": {(OpdConfig, "trainer"), (RlConfig, "trainer")}}
    )
    assert repeated_defaults("trainer/opd.yaml") == ["weight_decay", "loss.clip_low"]


def test_every_schema_key_is_overridable_and_a_typo_is_refused_by_name():
    # keys no YAML sets are reachable with a plain override, because the schema is the base of the primary
    cfg = compose("rl", ["+exp=demo_rl", "reward.num_actors=3", "trainer.zero_stage=1", "run.seed=5"])
    assert (cfg.reward.num_actors, cfg.trainer.zero_stage, cfg.model.seed) == (3, 1, 5)
    with pytest.raises(ConfigError, match=r"trainer\.zero_stag\b"):
        compose("rl", ["+exp=demo_rl", "trainer.zero_stag=1"])
    with pytest.raises(ConfigError, match=r"reward\.num_actors=many"):
        compose("rl", ["+exp=demo_rl", "reward.num_actors=many"])


def test_a_primary_whose_schema_is_not_registered_is_named(tmp_path):
    (tmp_path / "orphan.yaml").write_text("defaults:\n  - orphan_schema\n  - _self_\n")
    with pytest.raises(
        ConfigError, match=r"configs/orphan\.yaml is composed onto the schema 'orphan_schema'"
    ):
        compose("orphan", [], config_dir=str(tmp_path))


def test_a_new_typed_dict_entry_gets_the_parent_form_hint():
    # OmegaConf cannot assign a plain dict to a new key of dict[str, ChunkingConfig]; the parent form works
    with pytest.raises(ConfigError, match=r"added from its parent: \+PARENT=\{NAME: \{\.\.\.\}\}"):
        compose("data_build", ["+data.profiles.native={mode: session}"])
    cfg = compose("data_build", ["+data.profiles={native: {mode: session}}"])
    assert cfg.data.profiles.native.mode == "session"
