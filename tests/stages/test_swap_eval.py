"""The writer-swap matrix inside the RL stage (`swap_eval.every`): the current policy writes through the
stage's own gateway under identities of its own, the fixed reader answers, and `swap/*` is logged at the
evaluated steps with the tables in <run>/swap/step_N/."""

import json

import pytest

pytestmark = pytest.mark.slow


def test_rl_logs_the_swap_matrix_every_step(assets, stage, opd_one_rank):
    out = assets["root"] / "rl_swap"
    stage.run(stage.cmd("rl", assets, out, "num_steps=1", "save_every=1", f"init_checkpoint={opd_one_rank}/final",
                        "rl.num_windows_per_step=1", "swap_eval.every=1", "swap_eval.subsample=all",
                        "swap_eval.max_items_per_benchmark=4"),
              assets["root"] / "rl_swap.log")  # fmt: skip
    m = stage.metrics(out)
    for step in (0, 1):
        assert 0.0 <= m[step]["swap/native"] <= 100.0 and m[step]["swap/average"] == m[step]["swap/native"]
        assert m[step]["swap/failed_items"] == 0
        recs = [
            json.loads(x) for x in (out / "swap" / f"step_{step}" / "items.jsonl").read_text().splitlines()
        ]
        assert len(recs) == 4 and {r["writer"] for r in recs} == {f"step_{step}"}
        assert (out / "swap" / f"step_{step}" / "table.md").exists()
        plan = json.loads((out / "swap" / f"step_{step}" / "plan.json").read_text())
        assert len(plan["harnesses"]["native"]["items"]) == 4
    assert m[1]["rollout/platform_error_rollouts"] == 0
