"""The demo pipeline's own pieces (scripts/demo_lib/pipeline.py): the flawed teacher's demonstrations go
through the real native harness, one per chunk, and carry the planted flaws; the OPD/RL prompt split shares
no conversation with the demonstrations; the report reads first/last values from the runs' metrics and
checks its predictions against the paired bank-metric differences."""

import json
import random
import time

import pytest

from data_pipeline.ledger import gold_records, parse_record
from data_pipeline.store import BuiltDataset
from hymem_train.models.tokenizer import default_tokenizer
from reward.bank_sizes import BANK_SIZES_FILE
from scripts.demo_lib.pipeline import (
    GAIN_CLASSES,
    PREDICTIONS,
    TEACHER_FLAWS,
    _beside,
    build_data,
    demo_harness,
    final_eval_data,
    first_last,
    gain_decomposition,
    growth_overrides,
    paired_checks,
    reevaluate,
    run_demo,
    teacher_demonstrations,
    write_report,
)


def _ledger(path, n, seed):
    return build_data(path, num_sequences=n, num_chunks=6, window=3, seed=seed, world="ledger")


def test_teacher_demonstrations_write_each_chunk_with_the_planted_flaws_in_any_number_of_processes(tmp_path):
    ds_path = _ledger(tmp_path / "train", 6, 0)
    ds = BuiltDataset(ds_path)
    out = tmp_path / "sft" / "demos.jsonl"
    counts = teacher_demonstrations(ds_path, out, demo_harness(), TEACHER_FLAWS)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == counts["writer_segments"] == len(ds.tables["chunks"])  # one write per chunk
    tok = default_tokenizer()
    ops = [
        o for r in rows for o in json.loads(tok.decode(r["response_ids"], skip_special_tokens=True))["ops"]
    ]
    texts = [o["text"] for o in ops if o["op"] in ("ADD", "UPDATE")]
    assert texts and all(parse_record(t) is not None for t in texts)  # every write is a well-formed record
    assert all(isinstance(o["id"], int) for o in ops if o["op"] == "UPDATE")
    # the flaws were planted (small talk stored, history dropped) and the gold ops were written too
    assert counts["oracle_flaw_store_small_talk"] > 0 and counts["oracle_flaw_drop_history"] > 0
    assert counts["oracle_add"] > 0 and counts["oracle_update"] > 0
    # written by one process instead of two: the same file, the same counts
    one = tmp_path / "one" / "demos.jsonl"
    assert teacher_demonstrations(ds_path, one, demo_harness(), TEACHER_FLAWS, workers=1) == counts
    assert one.read_bytes() == out.read_bytes()
    # a flawless teacher writes exactly the gold bank's records (nothing more)
    gold = teacher_demonstrations(ds_path, tmp_path / "gold" / "demos.jsonl", demo_harness(), {})
    assert not any(k.startswith("oracle_flaw") for k in gold)
    chunks = {}
    for c in ds.tables["chunks"]:
        chunks.setdefault(c.sequence_id, []).append(c)
    assert gold["oracle_add"] == sum(
        len(gold_records(cs)) for cs in chunks.values()
    )  # one ADD per gold record


def test_the_final_evaluation_reads_the_stages_held_out_sequences_and_more(tmp_path):
    """The final evaluation's set extends the stages' held-out set (same config, more sequences): its first
    sequences are the stages' to the record, so a demo's stage-time figures and its final table share them."""
    held = BuiltDataset(_ledger(tmp_path / "data" / "eval", 2, 1000))
    final = BuiltDataset(final_eval_data(tmp_path, 4))
    for table in ("sequences", "chunks", "probes", "orm_questions"):
        rows = [r.model_dump() if hasattr(r, "model_dump") else r for r in final.tables[table]]
        first = [r.model_dump() if hasattr(r, "model_dump") else r for r in held.tables[table]]
        assert rows[: len(first)] == first and len(rows) > len(first), table
    assert len(final.tables["sequences"]) == 4
    with pytest.raises(ValueError, match="num_final_eval_sequences=1: want >= the 2 held-out sequences"):
        final_eval_data(tmp_path, 1)


def test_prompt_split_is_disjoint_from_the_demonstrations(tmp_path):
    sft, prompts = BuiltDataset(_ledger(tmp_path / "a", 6, 0)), BuiltDataset(_ledger(tmp_path / "b", 6, 2000))

    def convs(ds):
        return {tuple(t.text for t in c.turns) for c in ds.tables["chunks"]}

    assert len(convs(sft)) > 10 and not convs(sft) & convs(prompts)


def test_predictions_read_the_paired_bank_differences(tmp_path):
    p = tmp_path / "bank_metrics.json"
    assert [c["held"] for c in paired_checks(p)] == [False] * len(PREDICTIONS)  # no evaluation: nothing holds
    diffs = [
        {"a": "opd", "b": "sft", "metric": "memory_recall", "value": 0.2, "lo": 0.1, "hi": 0.3},
        {"a": "rl", "b": "opd", "metric": "false_memory_resistance", "value": 0.1, "lo": -0.02, "hi": 0.2},
    ]
    p.write_text(json.dumps({"harnesses": {"native": {"differences": diffs}}}))
    got = {(c["a"], c["metric"]): c for c in paired_checks(p)}
    assert got[("opd", "memory_recall")]["held"] and got[("opd", "memory_recall")]["lo"] == 0.1
    assert not got[("rl", "false_memory_resistance")]["held"]  # its interval covers 0
    assert not got[("rl", "history_kept")]["held"] and got[("rl", "history_kept")]["value"] is None
    # ">= 0" (no loss shown): an interval covering 0 holds, one below 0 does not
    for lo, hi, held in ((-0.05, 0.01, True), (-0.09, -0.01, False)):
        d = {"a": "rl", "b": "opd", "metric": "memory_recall", "value": (lo + hi) / 2, "lo": lo, "hi": hi}
        p.write_text(json.dumps({"harnesses": {"native": {"differences": [*diffs, d]}}}))
        assert {(c["a"], c["metric"]): c for c in paired_checks(p)}[("rl", "memory_recall")]["held"] is held
    # the same differences, split by operation class for OPD - SFT and RL - OPD
    rows = {
        r.split("|")[2].strip(): r
        for r in gain_decomposition(p)
        if r.startswith("| ") and "bank metric" not in r
    }
    assert set(rows) == {m for _, m in GAIN_CLASSES}
    assert "+0.200 [+0.100, +0.300]*" in rows["memory_recall"]  # excludes 0: starred
    assert "+0.100 [-0.020, +0.200] |" in rows["false_memory_resistance"]  # covers 0: no star
    assert rows["history_kept"].count("n/a") == 2


def test_report_reads_first_and_last_values(tmp_path):
    for name, rows in {
        "opd": [
            {"step": 0, "eval/reverse_kl": 0.8},
            {"step": 1, "distill/reverse_kl_topk": 0.6},
            {"step": 2, "eval/reverse_kl": 0.5, "distill/reverse_kl_topk": 0.4},
        ],
        "rl": [
            {"step": 0, "eval/s": 0.90, "eval/prm": 0.30, "eval/pen": 0.02},
            {"step": 1, "reward/s": 0.2, "reward/zero_advantage_share": 0.5},
            {
                "step": 2,
                "reward/s": 0.4,
                "reward/zero_advantage_share": 0.3,
                "eval/s": 0.36,
                "eval/prm": 0.35,
                "eval/pen": 0.01,
            },
        ],
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert first_last([{"a": 1}, {"b": 2}, {"a": 3}], "a") == (1, 3) and first_last([], "a") is None
    counts = {
        "train_sequences": 4,
        "prompt_sequences": 4,
        "eval_sequences": 2,
        "writer_segments": 24,
        "oracle_flaw_store_small_talk": 3,
        "leaked": {"eval": 0.0},
    }
    out = write_report(tmp_path, counts, {"total": 1.0})
    assert out["kl"] == (0.8, 0.5) and out["reward"] == (0.90, 0.36) and out["prm"] == (0.30, 0.35)
    text = (tmp_path / "report.md").read_text()
    assert "0.800 (step 0) -> 0.500" in text and "0.900 (step 0) -> 0.360" in text
    assert "mean over steps: 0.40" in text and (tmp_path / "report.png").stat().st_size > 0
    assert out["pen"] == (0.02, 0.01) and "pen[t]: 0.020 -> 0.010" in text
    assert (
        "flaw_store_small_talk 3" in text
        and "eval 0.0%" in text
        and "| opd - sft | memory_recall | > 0 | n/a | no |" in text
    )
    # the gates: step 0's held-out score over its maximum (0.90 / (1 + 2) = 0.30, in range), step 1's
    # zero-advantage share (0.5, the bound: met), and no evaluation, so no teacher recall (not met)
    assert [(g["value"], g["met"]) for g in out["gates"]] == [(None, False), (0.30, True), (0.5, True)]
    # the maximum is the RL run's own w_prm + w_orm: with w_orm 0 the same 0.90 is a rate above 0.7
    (tmp_path / "rl" / "config.yaml").write_text("reward:\n  scoring:\n    w_prm: 1.0\n    w_orm: 0.0\n")
    assert [(g["value"], g["met"]) for g in write_report(tmp_path, counts, {"total": 1.0})["gates"]][1] == (
        0.9,
        False,
    )
    (tmp_path / "rl" / "config.yaml").unlink()
    assert "teacher's held-out memory recall >= 0.6: n/a (NOT met)" in text
    (tmp_path / "swap" / "eval").mkdir(parents=True)
    writers = {"teacher": {"memory_recall": {"value": 0.59, "lo": 0.5, "hi": 0.7}}}
    (tmp_path / "swap" / "eval" / "bank_metrics.json").write_text(
        json.dumps({"harnesses": {"native": {"writers": writers, "differences": []}}})
    )
    assert not write_report(tmp_path, counts, {"total": 1.0})["gates"][0]["met"]  # 0.59 < 0.6


def test_growth_bounds_for_rl_come_from_the_opd_writes(tmp_path):
    """The demo's RL gets bounds calibrated from the OPD run's bank sizes; without enough recorded
    writes it keeps the config's and the report says why."""
    args, line = growth_overrides(tmp_path)
    assert args == [] and "not calibrated" in line and "no bank sizes recorded" in line
    rnd, rows = random.Random(0), []
    for i in range(30):  # 30 rollouts x 3 chunks, first writes of 8-24 tokens, then steady growth
        sizes, b = [], 0
        for _ in range(3):
            b += rnd.randint(8, 24)
            sizes.append(b)
        rows.append(
            {
                "trajectory_id": f"t{i}",
                "harness": "native",
                "status": "ok",
                "parent_size_tokens": 0,
                "size_tokens": sizes,
                "chunk_status": ["ok"] * 3,
                "step": 1,
            }
        )
    (tmp_path / BANK_SIZES_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    args, line = growth_overrides(tmp_path)
    kv = {k.rsplit(".", 1)[1]: v for k, v in (a.split("=") for a in args)}
    assert set(kv) == {"lower", "upper", "floor_tokens"} and 8 <= int(kv["floor_tokens"]) <= 24
    assert 1.0 <= float(kv["lower"]) < float(kv["upper"]) and "from 90 OPD writes" in line
    assert (tmp_path / "growth_bounds.yaml").read_text().count("native:") == 1


def test_the_student_is_an_earlier_epoch_of_the_teachers_run(tmp_path, monkeypatch):
    """The student is the teacher's SFT stopped early: an epoch count that is not earlier is refused
    before any stage runs, as are a final evaluation smaller than the stages' held-out set, a copy mix
    the pretraining corpus cannot supply, no demonstrations and no RL steps."""
    for k in (0, 3, 4):
        with pytest.raises(
            ValueError, match=f"student_epochs={k}: want 1 <= student_epochs < teacher_epochs=3"
        ):
            run_demo(tmp_path, student_epochs=k, teacher_epochs=3)
    assert not any(tmp_path.iterdir())  # nothing was built
    with pytest.raises(ValueError, match="num_final_eval_sequences=8: want >= num_eval_sequences=24"):
        run_demo(tmp_path, num_eval_sequences=24, num_final_eval_sequences=8)
    assert not any(tmp_path.iterdir())  # refused before any data is drawn

    # without the check the demo would start drawing data: fail there at once, not minutes later
    def drawn(*a, **kw):
        raise AssertionError("data drawn before the arguments were checked")

    monkeypatch.setattr("scripts.demo_lib.pipeline.build_data", drawn)
    for k in (-1, 4001):
        with pytest.raises(
            ValueError,
            match=f"teacher_pretrain_mix={k}: want 0 <= teacher_pretrain_mix <= pretrain_documents=4000",
        ):
            run_demo(tmp_path, teacher_pretrain_mix=k, pretrain_documents=4000)
    with pytest.raises(ValueError, match="num_train_sequences=0: want >= 1"):
        run_demo(tmp_path, num_train_sequences=0)
    with pytest.raises(ValueError, match="rl_steps=0: want >= 1"):
        run_demo(tmp_path, rl_steps=0)
    assert not any(tmp_path.iterdir())


def test_a_failed_reevaluation_leaves_the_old_table(tmp_path, monkeypatch):
    """`scripts/demo.py --reevaluate` replaces a demo's table only once the new evaluation is done."""
    (tmp_path / "report.json").write_text(json.dumps({"counts": {"run_seed": 0}, "timings": {}}))
    (tmp_path / "swap" / "eval").mkdir(parents=True)
    (tmp_path / "swap" / "eval" / "table.md").write_text("the old table")

    def fails(args, log_path):
        (tmp_path / "swap" / "eval").mkdir(parents=True)  # a half-written new evaluation
        raise RuntimeError("evaluation failed")

    monkeypatch.setattr("scripts.demo_lib.pipeline._run", fails)
    monkeypatch.setattr("scripts.demo_lib.pipeline.final_eval_data", lambda root, n: root)
    monkeypatch.setattr("scripts.demo_lib.pipeline.probe_leakage", lambda root, splits: {"final_eval": 0.0})
    with pytest.raises(RuntimeError, match="evaluation failed"):
        reevaluate(tmp_path)
    old_table = tmp_path / "swap" / "eval" / "table.md"
    assert old_table.exists() and old_table.read_text() == "the old table"
    assert not (tmp_path / "swap.previous").exists()


def test_a_side_evaluation_dies_with_its_stage_and_fails_the_demo_on_its_own(tmp_path):
    """The demo reads each writer beside the next stage: a failing stage stops its side process, and a
    failing side process fails the demo after the stage, naming its own log."""
    ok = ["-c", "pass"]
    marker = tmp_path / "side_ran_on"
    with pytest.raises(RuntimeError, match="exit 3"):
        _beside(
            ["-c", f"import time; time.sleep(2); open({str(marker)!r}, 'w')"],
            tmp_path / "side.log",
            ["-c", "raise SystemExit(3)"],
            tmp_path / "stage.log",
        )
    time.sleep(3)
    assert not marker.exists()  # killed, not left running
    with pytest.raises(RuntimeError, match="side_fails.log"):
        _beside(["-c", "raise SystemExit(5)"], tmp_path / "side_fails.log", ok, tmp_path / "stage.log")
    assert _beside(ok, tmp_path / "side.log", ok, tmp_path / "stage.log") >= 0.0
