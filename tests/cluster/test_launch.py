"""`python -m hymem_train.launch check`: what slurm/ray_job.sbatch learns before anything starts."""

import subprocess
import sys

import pytest

from hymem_train.config import ConfigError
from hymem_train.launch import check
from hymem_train.plan import PlanError

RL = ["+exp=hy_memory_rl", "data.per_harness.hy_memory_chat=/d", "cluster=slurm_16x8"]


def test_cpu_nodes_get_one_rank_each_and_no_gpus():
    lay = check("hymem_train.opd", 2, 0, ["+exp=demo_opd", "data.path=/d", "run.output_dir=/r/opd"])
    assert (lay.train_nodes, lay.procs_per_node, lay.ray_gpus_on_train_nodes) == (2, 1, 0)
    assert "RUN_DIR=/r/opd\n" in lay.shell() and "PREEMPT_REQUEST=/r/opd/PREEMPT\n" in lay.shell()


def test_report_placement_trains_on_the_first_nodes_and_hides_their_gpus_from_ray():
    split = check("hymem_train.rl", 16, 8, RL)  # train_gpus 64: nodes 0-7, 8 ranks each
    assert (split.train_nodes, split.procs_per_node, split.ray_gpus_on_train_nodes) == (8, 8, 0)
    # colocated, no separate reader/judge pools: trainer and policy share all 128 GPUs, so every node
    # trains and its Ray node offers its GPUs to the policy replicas
    colo = check(
        "hymem_train.rl",
        16,
        8,
        [
            *RL,
            "cluster.placement.mode=colocated",
            "cluster.placement.train_gpus=0",
            "cluster.placement.policy_replicas=0",
            "cluster.placement.reader.replicas=0",
            "cluster.placement.judge.replicas=0",
        ],
    )
    assert (colo.train_nodes, colo.procs_per_node, colo.ray_gpus_on_train_nodes) == (16, 8, 8)


def test_an_allocation_too_small_for_the_placement_is_refused():
    with pytest.raises(PlanError, match="too few GPUs"):
        check("hymem_train.rl", 2, 8, RL)


def test_trainer_gpus_that_do_not_fill_whole_nodes_are_refused():
    with pytest.raises(ConfigError, match="multiple of the GPUs per node"):
        # 480 rollouts divide over 12 ranks, but 12 GPUs are a node and a half
        check("hymem_train.rl", 16, 8, [*RL, "cluster.placement.train_gpus=12", "rl.num_windows_per_step=60"])


def test_a_bad_override_exits_2_with_the_key():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hymem_train.launch",
            "check",
            "hymem_train.opd",
            "1",
            "0",
            "+exp=demo_opd",
            "data.path=/d",
            "trainer.lr=fast",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "config error" in r.stderr and "trainer.lr" in r.stderr
    assert r.stdout == ""  # nothing for the job script to evaluate
