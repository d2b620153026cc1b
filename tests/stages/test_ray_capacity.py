"""A local Ray start too small for the stage's actors fails at start-up instead of hanging (hymem_train/cluster.py)."""

import logging

import pytest

from hymem_train.cluster import check_ray_capacity
from hymem_train.config import compose, to_typed
from hymem_train.run_config import OpdConfig, RlConfig, ray_cpu_demand


def _rl(*overrides: str) -> RlConfig:
    return to_typed(compose("rl", ["+exp=demo_rl", *overrides]), RlConfig)


def test_cpu_demand_counts_rollout_workers_and_reward_actors():
    cfg = _rl("rollout.num_workers=4", "rollout.num_cpus_per_worker=0.25", "reward.num_actors=1")
    assert ray_cpu_demand(cfg) == pytest.approx(4 * 0.25 + 1 * cfg.reward.num_cpus_per_actor)
    opd = to_typed(compose("opd", ["+exp=demo_opd", "rollout.num_workers=4"]), OpdConfig)
    assert ray_cpu_demand(opd) == pytest.approx(4 * opd.rollout.num_cpus_per_worker)  # no reward actors


def test_too_small_local_cluster_raises_a_clear_error(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    check_ray_capacity(_rl())  # the shipped demo fits 2 CPUs
    check_ray_capacity(to_typed(compose("opd", ["+exp=demo_opd"]), OpdConfig))  # 2 workers x 0.5: 1 CPU
    with pytest.raises(
        ValueError, match=r"reserve 4\.5 CPUs .* has 2: the actors that do not fit would wait"
    ):
        check_ray_capacity(_rl("rollout.num_workers=16", "rollout.num_cpus_per_worker=0.25"))


def test_joined_cluster_only_warns(monkeypatch, caplog):
    import ray

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    with caplog.at_level(logging.WARNING, logger="hymem_train.cluster"):
        check_ray_capacity(
            _rl("rollout.num_workers=16", "rollout.num_cpus_per_worker=0.25", "cluster.ray_address=auto")
        )
    assert "would wait forever" in caplog.text
