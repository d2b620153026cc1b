"""Every experiment composes and validates against the primaries it names."""

import re
from pathlib import Path

import pytest

from hymem_train.config import CONFIG_DIR, ConfigError, compose, config_diff, to_typed
from hymem_train.run_config import EvaluateConfig, ExportConfig, OpdConfig, RlConfig, ServeConfig

SCHEMAS = {
    "serve": ServeConfig,
    "opd": OpdConfig,
    "rl": RlConfig,
    "evaluate": EvaluateConfig,
    "export": ExportConfig,
}
EXPS = sorted(Path(CONFIG_DIR, "exp").glob("*.yaml"))


def _schemas():
    """Schemas of primaries owned by other components register here when they exist."""
    out = dict(SCHEMAS)
    from data_pipeline.build import DataBuildConfig
    from hymem_train.sft import SftConfig

    out["sft"] = SftConfig
    out["data_build"] = DataBuildConfig
    return out


def _primaries(path: Path) -> list[str]:
    m = re.search(r"^# primaries: (.+)$", path.read_text(), re.M)
    assert m, f"{path.name}: first lines must say '# primaries: <entry points>'"
    return m.group(1).split()


def test_there_are_experiments():
    names = {p.stem for p in EXPS}
    assert {"demo_cpu", "demo_opd", "demo_rl", "hy_memory_opd", "hy_memory_rl", "data_locomo_sample"} <= names
    # one overlay per ablation the report lists as not done (reward knobs)
    assert {
        f"ablation_{a}"
        for a in ("window_level_grpo", "broadcast_orm", "no_traps", "no_growth_penalty", "binary_reward")
    } <= names
    assert "ablation_one_vote_loss" in names  # the loss's sequence unit


def test_full_size_harness_mix_and_bounds():
    rl = to_typed(compose("rl", ["+exp=hy_memory_rl"]), RlConfig)
    assert set(rl.harnesses) == {
        "hy_memory_chat",
        "hy_memory_coding",
        "hy_memory_working",
        "mem0",
        "memoryos",
    }
    assert set(rl.harnesses) <= set(
        rl.reward.scoring.growth_bounds
    )  # silent failure harness-unscheduled, checked at start-up
    assert {rl.harnesses[h].scene for h in rl.harnesses if h.startswith("hy_memory")} == {
        "chat",
        "working",
        "coding",
    }


@pytest.mark.parametrize("exp", EXPS, ids=lambda p: p.stem)
def test_experiment_composes_and_validates(exp):
    text = exp.read_text()
    assert text.startswith("# @package _global_"), f"{exp.name} must start with '# @package _global_'"
    schemas = _schemas()
    for primary in _primaries(exp):
        assert primary in schemas, f"{exp.name} names unknown primary {primary!r}"
        cfg = to_typed(compose(primary, [f"+exp={exp.stem}"]), schemas[primary])
        assert cfg.run.name == exp.stem


@pytest.mark.parametrize("primary", ["serve"])
def test_primaries_compose_without_experiment(primary):
    to_typed(compose(primary), SCHEMAS[primary])


def test_evaluate_primary_names_what_it_lacks():
    """The matrix without writers or harnesses says so instead of scoring nothing."""
    with pytest.raises(ValueError, match="writers: name at least one writer"):
        to_typed(compose("evaluate"), EvaluateConfig)
    with pytest.raises(ValueError, match="declare at least one harness"):
        to_typed(compose("evaluate", ["writers=[{name: a, base_url: 'http://x/v1'}]"]), EvaluateConfig)


@pytest.mark.parametrize("primary", ["opd", "rl"])
def test_stage_primaries_need_data_and_harnesses(primary):
    """A stage without an experiment names what it lacks instead of training on nothing."""
    with pytest.raises(ConfigError, match="data.path"):
        to_typed(compose(primary), SCHEMAS[primary])
    with pytest.raises(ValueError, match="declare at least one harness"):
        to_typed(compose(primary, ["data.path=/d"]), SCHEMAS[primary])


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


# each ablation overlay and the one thing it changes from hy_memory_rl (report: ablations not done;
# one-vote loss: beyond the report). A new overlay must be added here.
ABLATION_KNOBS = {
    "window_level_grpo": "reward.scoring.advantage_level",
    "broadcast_orm": "reward.scoring.orm_mode",
    "counterfactual_orm": "reward.scoring.orm_mode",  # beyond the report: leave-one-chunk-out credit
    "no_traps": "reward.scoring.use_traps",
    "no_prm": "reward.scoring.w_prm",  # beyond the report: the outcome reward alone
    "no_growth_penalty": "reward.scoring.use_growth_penalty",
    "binary_reward": "reward.scoring.score_mode",
    "format_only": "reward.scoring.score_mode",  # the control: well-formedness is the whole reward
    "sft_init": "init_checkpoint",
    "single_harness": ("data.per_harness", "harnesses"),  # a harness is declared with its dataset
    "one_vote_loss": "trainer.loss.sequence_unit",
    "four_rollouts": "rl.num_rollouts_per_window",  # beyond the report: half the GRPO group
    "strong_growth_penalty": "reward.scoring.w_pen",  # beyond the report: ten times the penalty's weight
}


def test_ablation_overlays_flip_one_knob():
    base = to_typed(compose("rl", ["+exp=hy_memory_rl"]), RlConfig)
    names = {p.stem.removeprefix("ablation_") for p in EXPS if p.stem.startswith("ablation_")}
    assert names == set(ABLATION_KNOBS), "every configs/exp/ablation_*.yaml is listed with its one knob"
    for name, knob in ABLATION_KNOBS.items():
        cfg = to_typed(compose("rl", [f"+exp=ablation_{name}"]), RlConfig)
        diff = config_diff(base, cfg, atomic=("harnesses", "data.per_harness"))
        diff.pop("run.name"), diff.pop("run.output_dir")
        want = list(knob) if isinstance(knob, tuple) else [knob]
        assert list(diff) == want, f"ablation_{name} changes {sorted(diff)}, want only {want}"


def test_config_diff_names_each_changed_leaf():
    base = to_typed(compose("rl", ["+exp=demo_rl"]), RlConfig)
    cfg = to_typed(compose("rl", ["+exp=demo_rl", "trainer.lr=1e-3", "reward.search_k=3"]), RlConfig)
    assert config_diff(base, cfg) == {"trainer.lr": (1e-4, 1e-3), "reward.search_k": (10, 3)}
    one = to_typed(compose("rl", ["+exp=demo_rl", "harnesses.native.native.max_tokens=7"]), RlConfig)
    assert list(config_diff(base, one, atomic=("harnesses",))) == ["harnesses"]


def test_run_seed_reaches_every_seed():
    for primary, exp, schema in (("opd", "demo_opd", OpdConfig), ("rl", "demo_rl", RlConfig)):
        cfg = to_typed(compose(primary, [f"+exp={exp}", "run.seed=5"]), schema)
        assert (cfg.model.seed, cfg.engine.seed, cfg.gateway.seed, cfg.trainer.seed) == (5, 5, 5, 5)


def test_full_size_recipe_numbers():
    opd = to_typed(compose("opd", ["+exp=hy_memory_opd"]), OpdConfig)
    assert opd.opd.teacher_top_k == 50 and opd.opd.num_rollouts_per_row == 2
    assert (opd.cluster.num_nodes, opd.cluster.num_gpus_per_node) == (16, 8)
    assert opd.engine.kind == "vllm" and opd.engine.max_model_len >= 28_672 + 4_096
    rl = to_typed(compose("rl", ["+exp=hy_memory_rl"]), RlConfig)
    assert (rl.rl.num_windows_per_step, rl.rl.num_rollouts_per_window) == (64, 8)
    # context budgets per call: 28,672 prompt + 4,096 response, every harness
    for stage in (opd, rl):
        assert (stage.gateway.max_prompt_tokens, stage.gateway.max_response_tokens) == (28_672, 4_096)
        assert stage.gateway.prompt_over_cap == "drop_chunk"
        assert stage.harnesses["mem0"].options["max_tokens"] == 4_096
        assert stage.harnesses["memoryos"].options["max_tokens"] == 4_096
        assert {
            stage.harnesses[h].options["agent_max_tokens"] for h in stage.harnesses if h.startswith("hy_")
        } == {4_096}
