"""Every experiment composes and validates against the primaries it names (STYLE.md 7f)."""

import re
from pathlib import Path

import pytest

from hymem_train.config import CONFIG_DIR, ConfigError, compose, to_typed
from hymem_train.run_config import EvaluateConfig, ExportConfig, OpdConfig, RlConfig, ServeConfig

SCHEMAS = {"serve": ServeConfig, "opd": OpdConfig, "rl": RlConfig, "evaluate": EvaluateConfig,
           "export": ExportConfig}  # fmt: skip
EXPS = sorted(Path(CONFIG_DIR, "exp").glob("*.yaml"))


def _schemas():
    """Schemas of primaries owned by other components register here when they exist."""
    out = dict(SCHEMAS)
    try:
        from hymem_train.sft import SftConfig  # trainer component

        out["sft"] = SftConfig
    except ImportError:
        pass
    return out


def _primaries(path: Path) -> list[str]:
    m = re.search(r"^# primaries: (.+)$", path.read_text(), re.M)
    assert m, f"{path.name}: first lines must say '# primaries: <entry points>'"
    return m.group(1).split()


def test_there_are_experiments():
    assert {"demo_cpu", "hy_memory_opd", "hy_memory_rl"} <= {p.stem for p in EXPS}


@pytest.mark.parametrize("exp", EXPS, ids=lambda p: p.stem)
def test_experiment_composes_and_validates(exp):
    text = exp.read_text()
    assert text.startswith("# @package _global_"), f"{exp.name} must start with '# @package _global_'"
    schemas = _schemas()
    for primary in _primaries(exp):
        assert primary in schemas, f"{exp.name} names unknown primary {primary!r}"
        cfg = to_typed(compose(primary, [f"+exp={exp.stem}"]), schemas[primary])
        assert cfg.run.name == exp.stem


@pytest.mark.parametrize("primary", ["serve", "opd", "rl", "evaluate"])
def test_primaries_compose_without_experiment(primary):
    to_typed(compose(primary), SCHEMAS[primary])


def test_primaries_have_no_exp_slot():
    for p in Path(CONFIG_DIR).glob("*.yaml"):
        assert "exp:" not in p.read_text(), f"{p.name}: experiments are selected with +exp=NAME"


def test_wrong_key_names_the_key():
    with pytest.raises(ConfigError, match=r"model\.foo"):
        to_typed(compose("serve", ["+model.foo=1"]), ServeConfig)


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"engine\.max_batch_size"):
        to_typed(compose("serve", ["engine.max_batch_size=abc"]), ServeConfig)


def test_bad_value_fails_validation():
    with pytest.raises(ValueError, match="engine.kind"):
        to_typed(compose("serve", ["engine.kind=tgi"]), ServeConfig)
    with pytest.raises(ValueError, match="model.preset"):
        to_typed(compose("serve", ["model.preset=nope"]), ServeConfig)


def test_required_values_are_named():
    with pytest.raises(ConfigError, match="checkpoint, out_dir"):
        to_typed(compose("export"), ExportConfig)
    cfg = to_typed(compose("export", ["checkpoint=/c", "out_dir=/o"]), ExportConfig)
    assert cfg.out_dir == "/o"


def test_full_size_recipe_numbers():
    opd = to_typed(compose("opd", ["+exp=hy_memory_opd"]), OpdConfig)
    assert opd.opd.teacher_top_k == 50 and opd.opd.num_rollouts_per_row == 2
    assert (opd.cluster.num_nodes, opd.cluster.num_gpus_per_node) == (16, 8)
    assert opd.engine.kind == "vllm" and opd.engine.max_model_len >= 28_672 + 4_096
    rl = to_typed(compose("rl", ["+exp=hy_memory_rl"]), RlConfig)
    assert (rl.rl.num_windows_per_step, rl.rl.num_rollouts_per_window, rl.rl.max_chunks_per_window) == (
        64,
        8,
        5,
    )
    assert rl.rl.init_from_opd_step == 375
