"""configs/reward/default.yaml validates into RewardConfig; ablation knobs and bad keys; schedule
reconciliation (silent failure harness-unscheduled)."""

import shutil
from dataclasses import dataclass

import pytest

from hymem_train.config import CONFIG_DIR, ConfigError, compose, register_schema, to_typed
from reward.config import RewardConfig
from reward.schedule import ScheduleError, reconcile_schedule


@dataclass
class RewardOnly:
    reward: RewardConfig


@pytest.fixture
def config_dir(tmp_path):
    # a throw-away primary that selects only the reward group (the real primaries are not ours), composed
    # onto a schema as the real ones are
    register_schema("t", RewardOnly)
    shutil.copytree(f"{CONFIG_DIR}/reward", tmp_path / "reward")
    (tmp_path / "t.yaml").write_text("defaults:\n  - t_schema\n  - reward: default\n  - _self_\n")
    return str(tmp_path)


def test_default_reward_config_is_the_report_recipe(config_dir):
    cfg = to_typed(compose("t", [], config_dir=config_dir).reward, RewardConfig)
    s = cfg.scoring
    assert (s.w_prm, s.w_orm, s.w_pen, s.gamma) == (1.0, 2.0, 0.3, 0.0)
    assert (s.advantage_level, s.orm_mode, s.use_traps, s.use_growth_penalty, s.score_mode) == (
        "chunk",
        "attributed",
        True,
        True,
        "rubric",
    )
    assert set(s.growth_bounds) == {"native", "mem0", "hy_memory", "memoryos", "everos"}


@pytest.mark.parametrize(
    "override,field,value",
    [
        ("reward.scoring.advantage_level=window", "advantage_level", "window"),
        ("reward.scoring.orm_mode=broadcast", "orm_mode", "broadcast"),
        ("reward.scoring.use_traps=false", "use_traps", False),
        ("reward.scoring.use_growth_penalty=false", "use_growth_penalty", False),
        ("reward.scoring.score_mode=binary", "score_mode", "binary"),
    ],
)
def test_each_ablation_is_one_knob(config_dir, override, field, value):
    cfg = to_typed(compose("t", [override], config_dir=config_dir).reward, RewardConfig)
    assert getattr(cfg.scoring, field) == value


def test_bad_key_type_and_value_fail_at_start_up(config_dir):
    with pytest.raises(ConfigError, match="scoring.w_prn"):
        to_typed(compose("t", ["reward.scoring.w_prn=1"], config_dir=config_dir).reward, RewardConfig)
    with pytest.raises(ConfigError, match="num_actors"):
        to_typed(compose("t", ["reward.num_actors=two"], config_dir=config_dir).reward, RewardConfig)
    with pytest.raises(ValueError, match="orm_mode"):
        to_typed(compose("t", ["reward.scoring.orm_mode=both"], config_dir=config_dir).reward, RewardConfig)
    with pytest.raises(ValueError, match="growth_bounds.mem0"):
        to_typed(
            compose("t", ["reward.scoring.growth_bounds.mem0.upper=0.5"], config_dir=config_dir).reward,
            RewardConfig,
        )


def test_schedule_reconciles_with_declared_set():
    w = reconcile_schedule({"mem0": 1, "hy_memory": 1, "memoryos": 2}, ["mem0", "hy_memory", "memoryos"])
    assert w == {"hy_memory": 0.25, "mem0": 0.25, "memoryos": 0.5}
    assert reconcile_schedule(["mem0", "memoryos", "mem0"], ["mem0", "memoryos"]) == {
        "mem0": 2 / 3,
        "memoryos": 1 / 3,
    }


def test_schedule_missing_or_undeclared_harness_raises():
    with pytest.raises(
        ScheduleError,
        match=r"declared but never scheduled: \['memoryos'\].*silent failure harness-unscheduled",
    ):
        reconcile_schedule({"mem0": 1, "hy_memory": 1}, ["mem0", "hy_memory", "memoryos"])
    with pytest.raises(ScheduleError, match=r"declared but never scheduled: \['hy_memory'\]"):
        reconcile_schedule({"mem0": 1, "hy_memory": 0}, ["mem0", "hy_memory"])
    with pytest.raises(ScheduleError, match=r"scheduled but not declared: \['everos'\]"):
        reconcile_schedule(["mem0", "everos"], ["mem0"])
    with pytest.raises(ScheduleError, match=r"no reward growth_bounds for: \['hy_memory'\]"):
        reconcile_schedule(["mem0", "hy_memory"], ["mem0", "hy_memory"], growth_bounds={"mem0": object()})
