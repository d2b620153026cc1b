"""Colocated placement (cluster.placement.mode=colocated): the policy engine drops its weights while the
trainer steps and gets them back from the weight sync, and the run is the split run, step for step."""

import pytest

from tests.stages.conftest import OPD_TWO_STEPS

pytestmark = pytest.mark.slow


def test_colocated_opd_sleeps_the_engine_while_training_and_reproduces_the_split_run(
    assets, stage, opd_one_rank, monkeypatch
):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the reference's environment
    out = assets["root"] / "opd_colocated"
    cmd = stage.cmd("opd", assets, out, *OPD_TWO_STEPS, "cluster.placement.mode=colocated")
    stage.run(cmd, assets["root"] / "opd_colocated.log")
    m = stage.metrics(out)
    for s in (1, 2):  # the engine released its weights for the training of every step, and woke for the sync
        assert m[s]["perf/engine_freed_gb"] > 0 and m[s]["perf/time_wake_s"] >= 0
    assert "perf/engine_freed_gb" not in stage.metrics(opd_one_rank)[1]
    stage.same_run(opd_one_rank, out, stage.OPD_KEYS)
