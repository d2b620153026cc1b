"""The ablation runner at micro scale: every overlay is discovered with its one knob, a few of them
run for real (one RL step each), and the table has a row per ablation."""

import json
import shutil
import unittest.mock
from pathlib import Path

import pytest

import scripts.demo_lib.ablations as ab
import scripts.demo_lib.pipeline as pl
from scripts.demo_lib.ablations import (
    MANIFEST,
    START,
    collect_array,
    discover,
    plan_array,
    run_table,
    write_table,
)
from tests.stages.conftest import MICRO_RL, micro_demo_root

pytestmark = pytest.mark.slow


def test_discover_translates_each_overlay_to_the_tiny_recipe(tmp_path):
    table = {a.name: a for a in discover(tmp_path)}
    assert table["baseline"].overrides == []
    assert table["no_traps"].overrides == ["reward.scoring.use_traps=false"]
    assert table["window_level_grpo"].overrides == ["reward.scoring.advantage_level=window"]
    assert table["sft_init"].overrides == [f"init_checkpoint={tmp_path}/student_init/final"]
    assert table["single_harness"].skip_reason and not table["single_harness"].overrides
    # a knob absent from every YAML (a schema default) still applies
    assert table["one_vote_loss"].overrides == ["trainer.loss.sequence_unit=chunk"]
    assert table["format_only"].overrides == ["reward.scoring.score_mode=format_only"]


def test_runner_micro_scale_table_shape(tmp_path):
    root = micro_demo_root(tmp_path / "demo")
    # one real run (CI time: each is ~60 s); sft_init is a path knob (above), no_traps runs in the array
    # checks below from a copy of baseline's run directory
    only = ["baseline", "single_harness"]
    fast = MICRO_RL
    table = run_table(root, tmp_path / "out", seeds=1, steps=1, only=only, extra=fast)
    by = {a.name: a for a in table}
    assert list(by) == [*only, START]  # the OPD start is evaluated beside the arms
    assert list(by["baseline"].metrics) == [0] and not by["single_harness"].metrics
    assert 0.0 <= by["baseline"].metrics[0]["memory_recall"] <= 1.0
    assert by["baseline"].zero_adv and 0.0 <= by["baseline"].zero_adv[0] <= 1.0
    text = write_table(table, tmp_path / "ablations.md", steps=1, seeds=1, wall_s=1.0)
    assert "| single_harness | - | | | not run (the tiny recipe trains in one harness" in text
    arms = [r.split("|")[1].strip() for r in text.split("| arm |")[1].splitlines()[2:] if r.startswith("| ")]
    assert arms == ["baseline", START]
    assert Path(tmp_path / "ablations.png").stat().st_size > 0
    # finished runs and evaluations are reused: a second call starts no process, same numbers

    def refuse(cmd, **kw):
        raise AssertionError(f"started {cmd}")

    with (
        unittest.mock.patch.object(ab.subprocess, "run", refuse),
        unittest.mock.patch.object(pl, "_run", refuse),
    ):
        again = run_table(root, tmp_path / "out", seeds=1, steps=1, only=only, extra=fast)
    assert [a.metrics for a in again] == [a.metrics for a in table]
    # the job-array form (slurm/submit_ablations.sh): the tasks it plans are these runs' overrides, and
    # its table, evaluated from the run directories, holds each run's own checkpoint; a run that never
    # finished is named and left out, never read as a score

    arr = tmp_path / "array"
    plan_array(arr, base="demo_rl", seeds=1, only=["baseline", "no_traps", "single_harness"])
    tasks = [line.split("\t") for line in (arr / MANIFEST).read_text().splitlines()]
    assert [t[:2] for t in tasks] == [["baseline", "0"], ["no_traps", "0"]]  # single_harness: no tiny form
    assert "reward.scoring.use_traps=false" in tasks[1] and "+exp=demo_rl" in tasks[1]
    assert f"run.output_dir={arr.resolve()}/no_traps/seed0" in tasks[1] and "run.seed=0" in tasks[1]
    full = tmp_path / "array_full"
    plan_array(full, base="hy_memory_rl", seeds=2, only=["baseline", "single_harness"])
    exps = [line.split("\t")[3] for line in (full / MANIFEST).read_text().splitlines()]
    assert (
        exps == ["+exp=hy_memory_rl"] * 2 + ["+exp=ablation_single_harness"] * 2
    )  # the overlays as they are
    # point the manifest at the run made above and a copy of it whose final checkpoint is the SFT
    # student (evaluated from its own directory), plus one that never ran

    base_dir = tmp_path / "out" / "baseline" / "seed0"
    moved = tmp_path / "out" / "no_traps" / "seed0"
    shutil.copytree(base_dir, moved)
    shutil.rmtree(moved / "final")
    shutil.copytree(root / "student_init" / "final", moved / "final")
    rows = [[t[0], t[1], str(tmp_path / "out" / t[0] / "seed0"), *t[3:]] for t in tasks]
    rows.append(["no_traps", "1", str(tmp_path / "out" / "no_traps" / "seed1"), "+exp=demo_rl"])
    (arr / MANIFEST).write_text("\n".join("\t".join(r) for r in rows) + "\n")
    text = collect_array(arr, arr / "table.md", eval_data=root / "data" / "eval" / "native")
    assert "Unfinished runs, left out: no_traps: seeds 1." in text
    ev = json.loads((arr / "eval" / "seed0" / "eval" / "bank_metrics.json").read_text())
    w = ev["harnesses"]["native"]["writers"]
    assert (
        w["baseline"]
        == json.loads((tmp_path / "out" / "eval" / "seed0" / "eval" / "bank_metrics.json").read_text())[
            "harnesses"
        ]["native"]["writers"]["baseline"]
    )
    assert "| no_traps | false_memory_resistance |" in text  # its registered metric, one seed: no verdict
    writers = json.loads((arr / "eval" / "seed0" / "ablation_eval_key.json").read_text())["writers"]
    assert f"{{name: no_traps, checkpoint: '{moved}/final'}}" in writers
    # a run from an older run version, from another RL recipe (the demo's lr changed), or from another
    # OPD checkpoint at the same path (the demo retrained) is re-run from scratch, not reused
    stamp = base_dir / "ablation_key.json"
    kept = tmp_path / "kept_run"
    shutil.copytree(base_dir, kept)
    started = []

    def fail(cmd, **kw):
        started.append(cmd)
        return type("R", (), {"returncode": 3})()

    other = tmp_path / "demo_rl.yaml"
    other.write_text(ab.RECIPE.read_text().replace("lr: 1.0e-4", "lr: 3.0e-4"))
    assert other.read_text() != ab.RECIPE.read_text()
    for stale in ("recipe", "run_version", "start"):
        if stale != "recipe":
            shutil.copytree(kept, base_dir)
        if stale == "run_version":
            stamp.write_text(stamp.read_text().replace(ab.RUN_VERSION, "v1"))
        if stale == "start":  # the demo retrained in place: same paths, another OPD checkpoint
            weights = next((root / "opd" / "final").glob("*.safetensors"))
            weights.write_bytes(weights.read_bytes())
        recipe = other if stale == "recipe" else ab.RECIPE
        with (
            unittest.mock.patch.object(ab.subprocess, "run", fail),
            unittest.mock.patch.object(ab, "RECIPE", recipe),
            pytest.raises(RuntimeError, match="exit 3"),
        ):
            run_table(root, tmp_path / "out", seeds=1, steps=1, only=only, extra=fast)
        assert len(started) == 1 and "run.name=ablation_baseline_seed0" in started.pop()
        assert not stamp.exists()  # the stale run directory was removed before the re-run
