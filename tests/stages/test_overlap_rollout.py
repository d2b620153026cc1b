"""rl.overlap_rollout: step k+1's rollouts are collected while step k trains, one weight version stale,
and a preempted run drops the batch it collected for a step it will not train (docs/stages.md)."""

import json

import pytest

pytestmark = pytest.mark.slow


def test_overlapped_rollout_is_one_version_stale_hides_the_training_and_survives_preemption(
    assets, stage, tmp_path
):
    out = tmp_path / "rl_overlap"
    out.mkdir()
    cmd = stage.cmd(
        "rl",
        assets,
        out,
        "num_steps=4",
        "save_every=4",
        "init_checkpoint=",
        "rl.overlap_rollout=true",
    )
    (out / "PREEMPT").write_text("")  # a request before the start: the run stops after step 1
    stage.run(cmd, tmp_path / "first.log")
    assert json.loads((out / "preempted.json").read_text())["step"] == 1
    # step 2's batch was collected while step 1 trained; the preempted job never trains it: dropped
    assert not (out / "rollouts" / "step_2").exists()
    assert (out / "rollouts").exists()
    stage.run(cmd, tmp_path / "second.log")  # resumes at step 2
    m = stage.metrics(out)
    assert sorted(m) == [0, 1, 2, 3, 4]
    lag = {s: m[s]["rollout/policy_lag_max"] for s in (1, 2, 3, 4)}
    # measured from the version the engine stamped on each segment: a batch collected on a step's own
    # clock (the first of each job) is on-policy, one collected during the previous step's training
    # is exactly one version behind the weights it trains
    assert lag == {1: 0.0, 2: 0.0, 3: 1.0, 4: 1.0}, lag
    assert m[3]["rollout/policy_lag_mean"] == m[4]["rollout/policy_lag_mean"] == 1.0
    for s in (1, 2, 3):  # each of these steps collected the next one's batch in the background
        assert m[s]["overlap/hidden_s"] > 0 and m[s]["overlap/next_rollout_s"] > 0, (s, m[s])
    assert "overlap/hidden_s" not in m[4]  # the last step has no next batch
    for s in (1, 2, 3, 4):
        assert m[s]["rollout/llm_calls"] > 0 and m[s]["rollout/windows_done"] >= 1, (s, m[s])
    assert (out / "final" / "model.safetensors").exists()
