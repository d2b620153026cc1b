"""A real stage CLI run as a cluster user sees it: one line per step on stdout
and in Hydra's log, Hydra's files in the run directory (no ./outputs in the working directory), and
the resolved config in the wandb run."""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_rl_run_logs_each_step_into_the_run_dir_and_wandb_gets_the_config(assets, stage, tmp_path):
    out = tmp_path / "run"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    # also the writer-swap matrix at steps 0 and 2 (swap_eval: docs/evaluation.md, "In a stage")
    cmd = stage.cmd(
        "rl",
        assets,
        out,
        "num_steps=2",
        "save_every=2",
        "init_checkpoint=",
        "swap_eval.every=2",
        "swap_eval.subsample=all",
        "swap_eval.max_items_per_benchmark=4",
    )
    cmd = [c for c in cmd if c != "logging.wandb_mode=disabled"] + ["logging.wandb_mode=offline"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_SILENT": "true"}
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert not (cwd / "outputs").exists() and list(cwd.iterdir()) == []  # nothing left in the cwd
    hydra_log = (out / "hydra" / "rl.log").read_text()
    for step in (1, 2):
        line = f"step {step} "
        assert any(line in x and "train/loss=" in x for x in hydra_log.splitlines()), hydra_log[-2000:]
        assert any(line in x and "train/loss=" in x for x in r.stdout.splitlines()), r.stdout[-2000:]
    assert (out / "hydra" / ".hydra" / "overrides.yaml").exists()
    # wandb (offline): a fresh id recorded in the run dir, and the run's config is the resolved one
    run_id = (out / "wandb_run_id").read_text().strip()
    (run_dir,) = (out / "wandb").glob(f"offline-run-*-{run_id}")
    # offline, the config is a JSON record inside the run's .wandb file (files/config.yaml comes at sync)
    record = (run_dir / f"run-{run_id}.wandb").read_bytes()
    for key in (b'"sequence_unit"', b'"max_prompt_tokens"', b'"num_ppo_epochs"', str(out).encode()):
        assert key in record, key
    check_swap_eval(out, stage.metrics(out))


def check_swap_eval(out, m):
    """The current policy wrote through the stage's gateway, the fixed reader answered, `swap/*` was logged
    at the evaluated steps (not in between) and the tables are in <run>/swap/step_N/."""
    assert "swap/average" not in m[1]
    for step in (0, 2):
        assert 0.0 <= m[step]["swap/native"] <= 100.0 and m[step]["swap/average"] == m[step]["swap/native"]
        assert m[step]["swap/failed_items"] == 0
        d = out / "swap" / f"step_{step}"
        recs = [json.loads(x) for x in (d / "items.jsonl").read_text().splitlines()]
        plan = json.loads((d / "plan.json").read_text())["harnesses"]["native"]
        assert 1 <= len(recs) == len(plan["items"]) <= 4  # the held-out set's items, at most 4
        assert plan["writer_decoding"] == {"temperature": 0.0}  # what the cache was built under
        assert {r["writer"] for r in recs} == {f"step_{step}"} and all("score" in r for r in recs)
        assert (d / "table.md").exists()
        # the policy wrote greedily, as the evaluation protocol does, not at the rollouts' temperature 1.0
        assert (
            json.loads((d / "summary.json").read_text())["harnesses"]["native"]["native"]["temperature"]
            == 0.0
        )
