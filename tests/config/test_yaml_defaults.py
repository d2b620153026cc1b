"""Component YAMLs hold only values that differ from their dataclass defaults (issue "Stage layer
redesign", item 6): a repeated default hides which values are choices and drifts when the default
changes. The one exception is a key the command line overrides: Hydra refuses `key=value` for a key
the composed YAML lacks, so such a key stays, listed in OVERRIDE_TARGETS with who overrides it."""

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from data_pipeline.annotate import AnnotatorConfig
from hymem_train.config import CONFIG_DIR
from hymem_train.trainer.config import LossConfig, TrainerConfig
from reward.config import RewardConfig

CONFIGS = Path(CONFIG_DIR)
# (YAML file, dotted key inside it, or "" for the whole file) -> schema
CHECKED = [("reward/default.yaml", "", RewardConfig), ("data_build.yaml", "annotator", AnnotatorConfig)] + [
    (f"trainer/{p.name}", "", TrainerConfig) for p in sorted((CONFIGS / "trainer").glob("*.yaml"))
]

# (file, dotted key) -> why a value equal to the default is kept
_STAGE_TESTS_AND_DEMO = "tests/stages/conftest.py and make demo (scripts/demo_lib/pipeline.py) override it"
OVERRIDE_TARGETS = {
    **{
        ("reward/default.yaml", f"scoring.{k}"): "ablation knob, flipped on the command line (tests/reward)"
        for k in ("advantage_level", "orm_mode", "use_traps", "use_growth_penalty", "score_mode")
    },
    **{
        ("reward/default.yaml", f"scoring.growth_bounds.{h}.floor_tokens"): "set by the overrides "
        "reward.calibrate_growth prints (make demo passes them)"
        for h in ("native", "mem0", "hy_memory", "memoryos", "everos")
    },
    ("reward/default.yaml", "judge.timeout_s"): "tests/stages/test_fault_injection.py overrides it",
    ("reward/default.yaml", "judge.num_retries"): "tests/stages/test_fault_injection.py overrides it",
    ("reward/default.yaml", "judge_kind"): "tests/stages/test_fault_injection.py overrides it",
    ("reward/default.yaml", "num_actors"): "tests/stages/test_ray_capacity.py, tests/reward override it",
    **{
        (f"trainer/{f}.yaml", k): _STAGE_TESTS_AND_DEMO
        for f in ("opd", "rl", "sft")
        for k in ("zero_stage", "gradient_checkpointing")
    },
    **{
        (
            "data_build.yaml",
            f"annotator.{k}",
        ): "overridden on the command line (docs/data.md, tests/data_pipeline)"
        for k in (
            "base_url",
            "model",
            "api_key",
            "num_transport_retries",
            "num_workers",
            "use_json_schema",
            "progress",
        )
    },
}


def _repeated_defaults(node: Any, schema: type, prefix: str) -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf under `node` that equals the schema field's default."""
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    out: list[tuple[str, Any]] = []
    for key, value in node.items():
        assert key in fields, f"{prefix}{key}: not a field of {schema.__name__}"
        f, hint = fields[key], hints[key]
        if dataclasses.is_dataclass(hint):
            out += _repeated_defaults(value, hint, f"{prefix}{key}.")
        elif typing.get_origin(hint) is dict and dataclasses.is_dataclass(typing.get_args(hint)[1]):
            for name, sub in value.items():
                out += _repeated_defaults(sub, typing.get_args(hint)[1], f"{prefix}{key}.{name}.")
        elif f.default is not dataclasses.MISSING and value == f.default:
            out.append((f"{prefix}{key}", value))
    return out


@pytest.mark.parametrize("path,key,schema", CHECKED, ids=lambda x: x if isinstance(x, str) else "")
def test_yaml_repeats_no_dataclass_default(path, key, schema):
    node = OmegaConf.to_container(OmegaConf.load(CONFIGS / path))
    node.pop("defaults", None)
    if key:
        node = node[key]
        prefix = f"{key}."
    else:
        prefix = ""
    found = _repeated_defaults(node, schema, prefix)
    repeated = [f"{k}={v!r}" for k, v in found if (path, k) not in OVERRIDE_TARGETS]
    assert not repeated, (
        f"configs/{path} repeats the {schema.__name__} default of: {', '.join(repeated)}; drop the line "
        "(or, if the command line overrides it, list it in OVERRIDE_TARGETS with the reason)"
    )


def test_override_targets_are_still_repeated_defaults():
    """An OVERRIDE_TARGETS entry whose key is gone or no longer the default is stale."""
    found = set()
    for path, key, schema in CHECKED:
        node = OmegaConf.to_container(OmegaConf.load(CONFIGS / path))
        node.pop("defaults", None)
        found |= {
            (path, k)
            for k, _ in _repeated_defaults(node[key] if key else node, schema, f"{key}." if key else "")
        }
    stale = sorted(set(OVERRIDE_TARGETS) - found)
    assert not stale, f"OVERRIDE_TARGETS entries that are not repeated defaults (drop them): {stale}"


def test_the_check_catches_a_repeated_default():
    assert _repeated_defaults({"lr": 1e-6, "weight_decay": 0.0}, TrainerConfig, "") == [("weight_decay", 0.0)]
    assert _repeated_defaults({"kind": "ppo", "clip_low": 0.2}, LossConfig, "loss.") == [
        ("loss.clip_low", 0.2)
    ]
