"""The ablation runner at micro scale: every overlay is discovered with its one knob, a few of them
run for real (one RL step each), and the table has a row per ablation."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_discover_translates_each_overlay_to_the_tiny_recipe(tmp_path):
    from scripts.demo_lib.ablations import discover

    table = {a.name: a for a in discover(tmp_path)}
    assert table["baseline"].overrides == []
    assert table["no_traps"].overrides == ["++reward.scoring.use_traps=false"]
    assert table["window_level_grpo"].overrides == ["++reward.scoring.advantage_level=window"]
    assert table["sft_init"].overrides == [f"init_checkpoint={tmp_path}/student_init/final"]
    assert table["single_harness"].skip_reason and not table["single_harness"].overrides
    # a knob absent from every YAML (a schema default) still applies
    assert table["one_vote_loss"].overrides == ["++trainer.loss.sequence_unit=chunk"]
    assert table["format_only"].overrides == ["++reward.scoring.score_mode=format_only"]


def test_runner_micro_scale_table_shape(tmp_path):
    from hymem_train.models import build_model
    from hymem_train.models.tokenizer import default_tokenizer
    from scripts.demo_lib.ablations import run_table, write_table
    from scripts.demo_lib.pipeline import build_data

    root = tmp_path / "demo"
    for split, n, seed in (("prompts", 2, 0), ("eval", 1, 7)):
        build_data(root / "data" / split, num_sequences=n, num_chunks=2, window=2, seed=seed)
    tok = default_tokenizer()
    for d, preset in (
        ("opd/final", "tiny_student"),
        ("student_init/final", "tiny_student"),
        ("sft/final", "tiny_teacher"),
    ):
        build_model(preset, seed=1).save_pretrained(root / d)
        tok.save_pretrained(root / d)
    # one real run (CI time: each is ~60 s); sft_init is a path knob (above), no_traps runs in the array
    # checks below from a copy of baseline's run directory
    only = ["baseline", "single_harness"]
    fast = ["rollout.num_workers=2", "harnesses.native.native.max_tokens=16", "rl.num_windows_per_step=1"]
    table = run_table(root, tmp_path / "out", seeds=1, steps=1, eval_rollouts=1, only=only, extra=fast)
    assert [a.name for a in table] == only
    assert len(table[0].finals) == 1 and len(table[0].starts) == 1 and not table[1].finals
    text = write_table(table, tmp_path / "ablations.md", steps=1, seeds=1, wall_s=1.0)
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| ablation")]
    assert [r.split("|")[1].strip() for r in rows] == only
    assert "not run (the tiny recipe trains in one harness" in rows[1]
    assert Path(tmp_path / "ablations.png").stat().st_size > 0
    # finished runs are reused: a second call starts no process and reads the same numbers
    again = run_table(root, tmp_path / "out", seeds=1, steps=1, eval_rollouts=1, only=only, extra=fast)
    assert [a.finals for a in again] == [a.finals for a in table]
    # the job-array form (slurm/submit_ablations.sh): the tasks it plans are these runs' overrides, and
    # its table, read back from the run directories, holds the same numbers; a run that never finished
    # is named and left out of its mean, never read as a score
    from scripts.demo_lib.ablations import MANIFEST, METRIC, collect_array, plan_array

    arr = tmp_path / "array"
    plan_array(arr, base="demo_rl", seeds=1, only=["baseline", "no_traps", "single_harness"])
    tasks = [line.split("\t") for line in (arr / MANIFEST).read_text().splitlines()]
    assert [t[:2] for t in tasks] == [["baseline", "0"], ["no_traps", "0"]]  # single_harness: no tiny form
    assert "++reward.scoring.use_traps=false" in tasks[1] and "+exp=demo_rl" in tasks[1]
    assert f"run.output_dir={arr.resolve()}/no_traps/seed0" in tasks[1] and "run.seed=0" in tasks[1]
    full = tmp_path / "array_full"
    plan_array(full, base="hy_memory_rl", seeds=2, only=["baseline", "single_harness"])
    exps = [line.split("\t")[3] for line in (full / MANIFEST).read_text().splitlines()]
    assert (
        exps == ["+exp=hy_memory_rl"] * 2 + ["+exp=ablation_single_harness"] * 2
    )  # the overlays as they are
    # point the manifest at the run made above and a copy of it whose final score was moved by 0.25
    # (so a row read from the other directory shows), plus one that never ran
    import shutil

    base_dir = tmp_path / "out" / "baseline" / "seed0"
    moved = tmp_path / "out" / "no_traps" / "seed0"
    shutil.copytree(base_dir, moved)
    hist = [json.loads(x) for x in (moved / "metrics.jsonl").read_text().splitlines() if x.strip()]
    last = max(i for i, r in enumerate(hist) if METRIC in r)
    hist[last][METRIC] += 0.25
    (moved / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in hist))
    finals = {"baseline": table[0].finals[0], "no_traps": table[0].finals[0] + 0.25}
    rows = [[t[0], t[1], str(tmp_path / "out" / t[0] / "seed0"), *t[3:]] for t in tasks]
    rows.append(["no_traps", "1", str(tmp_path / "out" / "no_traps" / "seed1"), "+exp=demo_rl"])
    (arr / MANIFEST).write_text("\n".join("\t".join(r) for r in rows) + "\n")
    text = collect_array(arr, arr / "table.md")
    got = {
        r.split("|")[1].strip(): r for r in text.splitlines() if r.startswith("| ") and "ablation" not in r
    }
    for name, final in finals.items():
        assert f"| {final:.3f} ± nan |" in got[name], (name, got[name])
    assert "Unfinished runs, left out of the means: no_traps: seeds 1." in text
    # a run from an older metric version (or another command) is re-run from scratch, not reused
    import scripts.demo_lib.ablations as ab

    stamp = base_dir / "ablation_key.json"
    stamp.write_text(stamp.read_text().replace(ab.METRIC_VERSION, "v1"))
    started = []

    def refuse(cmd, **kw):
        started.append(cmd)
        return type("R", (), {"returncode": 3})()

    import unittest.mock

    with (
        unittest.mock.patch.object(ab.subprocess, "run", refuse),
        pytest.raises(RuntimeError, match="exit 3"),
    ):
        run_table(root, tmp_path / "out", seeds=1, steps=1, eval_rollouts=1, only=only, extra=fast)
    assert len(started) == 1 and "run.name=ablation_baseline_seed0" in started[0]
    assert not stamp.exists()  # the stale run directory was removed before the re-run
