"""The matrix's tables: failures excluded and counted, harness and overall means, paired intervals,
held-out columns marked; and the judge replies' strict parsing (an off-contract reply is a failure)."""

import math

import numpy as np
import pytest

from data_pipeline.chunking import iso_date
from harnesses.registry import HarnessConfig
from hymem_train.evaluation.config import EvalData, MatrixConfig
from hymem_train.evaluation.report import build_table, to_markdown
from reward.eval_protocol import (
    longmemeval_judge_messages,
    metric_for,
    parse_locomo_label,
    parse_yes_no,
    token_f1,
)
from reward.llm import ParseError


def rec(w, h, m, i, score=None, fail=None, cat="1", seq=None, finish="stop"):
    """One scored item, or a failed one: fail = "writer" | "platform"."""
    r = {
        "writer": w,
        "harness": h,
        "metric": m,
        "item_id": f"q{i}",
        "category": cat,
        "sequence_id": seq or f"s{i}",
    }
    if fail:
        r["failure"] = {"stage": "bank_build", "class": fail, "detail": "x"}
    else:
        r["score"], r["finish_reason"] = score, finish
    return r


def test_writer_failures_score_zero_and_platform_failures_drop_the_item_for_every_writer():
    recs = [rec("a", "mem0", "LoCoMo Judge", i, s) for i, s in enumerate([1, 0, 1, 1])]
    recs += [rec("b", "mem0", "LoCoMo Judge", i, 1) for i in range(4)]
    recs += [rec("a", "mem0", "LongMemEval", 5, 1), rec("a", "mem0", "LongMemEval", 6, fail="writer")]
    recs += [rec("b", "mem0", "LongMemEval", 5, 1), rec("b", "mem0", "LongMemEval", 6, 1)]
    recs += [rec("a", "mem0", "LongMemEval", 7, 1), rec("b", "mem0", "LongMemEval", 7, fail="platform")]
    recs += [rec(w, "everos", "LoCoMo Judge", i, 1) for w in "ab" for i in range(3)]
    t = build_table(recs, ["a", "b"], ["mem0", "everos"], {"mem0": False, "everos": True}, resamples=300)
    a, b = t.cells[("a", "mem0", "LongMemEval")], t.cells[("b", "mem0", "LongMemEval")]
    # a's own failure is a 0 in a's mean; b's platform failure on q7 drops q7 for a as well
    assert (a.mean, a.n, a.writer_failures, a.excluded) == (50.0, 2, 1, 1)
    assert (b.mean, b.n, b.writer_failures, b.excluded) == (100.0, 2, 0, 1)
    assert t.cells[("a", "mem0", "LoCoMo Judge")].mean == 75.0
    assert t.harness_scores[("a", "mem0")].mean == pytest.approx((75.0 + 50.0) / 2)
    assert t.average["a"].mean == pytest.approx(((75.0 + 50.0) / 2 + 100.0) / 2)
    md = to_markdown(t, [])
    assert "everos (held out)" in md and "(1 writer-failed, 1 excluded)" in md
    assert "mean of LoCoMo Judge, LongMemEval (2 of the report's 6 metrics)" in md


def test_shopping_ps_is_a_column_out_of_every_mean_and_cmb_is_not_run():
    recs = [rec("a", "native", "Travel SPS", i, 0.5) for i in range(4)]
    recs += [rec("a", "native", "Shopping PS", 10 + i, 1.0) for i in range(4)]
    t = build_table(recs, ["a"], ["native"], {}, resamples=50)
    assert t.cells[("a", "native", "Shopping PS")].mean == 100.0
    assert t.harness_scores[("a", "native")].mean == 50.0 and t.average["a"].mean == 50.0
    md = to_markdown(t, [])
    assert "Shopping PS shown per metric, out of the means" in md
    assert "CMB: not run (no public data)" in md


def test_truncated_answers_are_counted_and_flagged_above_one_percent():
    recs = [rec("a", "native", "Travel SPS", i, 0.0, finish="length" if i < 2 else "stop") for i in range(50)]
    c = build_table(recs, ["a"], ["native"], {}, resamples=20).cells[("a", "native", "Travel SPS")]
    assert c.truncated == 2 and "2 cut TRUNCATION" in c.fmt()


def _correlated(n=80, seed=0):
    """Two writers over n conversations, each conversation feeding two harnesses with the same score
    (an easy conversation is easy everywhere); writer b scores a conversation's items like a does."""
    rng = np.random.default_rng(seed)
    easy = rng.random(n) < 0.5
    return [
        rec(w, h, "LoCoMo Judge", f"{h}{i}", float(easy[i]), seq=f"conv{i}")
        for w in "ab"
        for h in ("mem0", "hy_memory")
        for i in range(n)
    ]


def test_clustered_intervals_widen_where_items_are_shared_across_cells():
    """The same conversations feed both harnesses: drawing each cell on its own treats them as independent
    evidence and narrows the Average's interval by about sqrt(2); the clustered draw does not."""
    t = build_table(_correlated(), ["a", "b"], ["mem0", "hy_memory"], {}, resamples=2000)
    assert t.resampling == "clustered" and t.compare["resampling"] == "cell"
    width = t.average["a"].hi - t.average["a"].lo
    cell = t.compare["average"]["a"]
    ratio = width / (cell.hi - cell.lo)
    assert 1.25 < ratio < 1.6, ratio  # sqrt(2) = 1.41 in expectation
    assert "Intervals side by side: clustered (the table's) and cell" in to_markdown(t, [])
    # inside one cell too: five questions asked of each conversation, answered alike, are one draw
    easy = np.random.default_rng(2).random(40) < 0.5
    five = [
        rec("a", "native", "LoCoMo Judge", f"c{c}q{q}", float(easy[c]), seq=f"conv{c}")
        for c in range(40)
        for q in range(5)
    ]
    one = build_table(five, ["a"], ["native"], {}, resamples=2000)
    ratio = (one.average["a"].hi - one.average["a"].lo) / (
        one.compare["average"]["a"].hi - one.compare["average"]["a"].lo
    )
    assert 1.8 < ratio < 2.7, ratio  # sqrt(5) = 2.24


def test_clustered_draw_keeps_every_benchmark_in_every_replicate():
    """Two LoCoMo conversations and eight LongMemEval haystacks (the shipped slices' shape): drawn from
    the pool, 11% of replicates hold no LoCoMo conversation and the harness score is LongMemEval's alone.
    Stratified by the metrics a sequence feeds, a writer right on every LoCoMo item and wrong on every
    LongMemEval one scores 50 in every replicate."""
    recs = [
        rec("a", "native", "LoCoMo Judge", f"c{c}q{q}", 1.0, seq=f"conv{c}")
        for c in range(2)
        for q in range(5)
    ]
    recs += [rec("a", "native", "LongMemEval", f"h{c}", 0.0, seq=f"hay{c}") for c in range(8)]
    t = build_table(recs, ["a"], ["native"], {}, resamples=2000)
    assert t.cells[("a", "native", "LoCoMo Judge")].lo == 100.0
    assert (t.average["a"].mean, t.average["a"].lo, t.average["a"].hi) == (50.0, 50.0, 50.0)


def test_a_small_paired_difference_is_detected_paired_and_missed_unpaired():
    """Writer a gets 6 of 200 items right that b misses, and every other item the same: +3 points."""
    n = 200
    hard = np.random.default_rng(1).random(n) < 0.5
    b = [rec("b", "native", "LoCoMo Judge", i, float(not hard[i])) for i in range(n)]
    flips = [i for i in range(n) if hard[i]][:6]
    a = [rec("a", "native", "LoCoMo Judge", i, float(not hard[i] or i in flips)) for i in range(n)]
    paired = build_table(a + b, ["a", "b"], ["native"], {}, resamples=2000)
    d = paired.diffs[("a", "b", "Average")]
    assert d.mean == pytest.approx(3.0) and d.lo > 0
    unpaired = build_table(a + b, ["a", "b"], ["native"], {}, resamples=2000, resampling="unpaired")
    u = unpaired.diffs[("a", "b", "Average")]
    assert u.mean == pytest.approx(3.0) and u.lo < 0 < u.hi


def test_paired_difference_is_a_tie_only_when_its_interval_holds_zero():
    n = 60
    same = [rec(w, "native", "LoCoMo Judge", i, i % 2) for w in ("a", "b") for i in range(n)]
    d = build_table(same, ["a", "b"], ["native"], {}, resamples=500).diffs[("a", "b", "Average")]
    assert d.mean == 0 and d.lo <= 0 <= d.hi
    assert (
        "tie"
        in to_markdown(build_table(same, ["a", "b"], ["native"], {}, resamples=500), [])
        .split("| a - b |")[1]
        .split("\n")[0]
    )


def test_all_excluded_cell_is_nan_not_zero():
    recs = [rec("a", "native", "LoCoMo Judge", i, fail="platform") for i in range(3)]
    t = build_table(recs, ["a"], ["native"], {}, resamples=50)
    c = t.cells[("a", "native", "LoCoMo Judge")]
    assert c.n == 0 and c.excluded == 3 and math.isnan(c.mean)
    assert "excluded (3)" in to_markdown(t, [])


def test_judge_replies_are_parsed_strictly():
    assert parse_locomo_label('The answer names the same city. {"label": "CORRECT"}').score == 1.0
    assert parse_locomo_label('{"label": "WRONG"}').score == 0.0
    for bad in ("CORRECT", '{"label": "correct"}', '{"verdict": "CORRECT"}', ""):
        with pytest.raises(ParseError):
            parse_locomo_label(bad)
    assert parse_yes_no("Yes.").score == 1.0 and parse_yes_no("no").score == 0.0
    with pytest.raises(ParseError):
        parse_yes_no("I cannot tell")


def test_longmemeval_prompt_follows_the_question_type():
    class It:
        item_id, question, answer, is_trap = "lme_s/abc/q0", "How many days?", "18", False
        category = "temporal-reasoning"

    assert "off-by-one" in longmemeval_judge_messages(It, "19 days")[0]["content"]
    It.item_id = "lme_s/abc_abs/q0"
    assert "unanswerable" in longmemeval_judge_messages(It, "I don't know")[0]["content"]
    It.item_id, It.category = "lme_s/abc/q0", "no-such-type"
    with pytest.raises(ValueError, match="no published judge prompt"):
        longmemeval_judge_messages(It, "x")
    assert metric_for("locomo").counts(type("I", (), {"category": "5"})) is False  # adversarial: not scored


def test_token_f1():
    assert token_f1("Paris", "paris.") == 1.0
    assert token_f1("He moved to Paris in May", "Paris") == pytest.approx(
        2 * (1 / 6) / (1 / 6 + 1)
    )  # 6 tokens, 1 shared
    assert token_f1("", "Paris") == 0.0


def test_iso_date_converts_the_sources_layouts_and_refuses_others():
    """hy-memory and EverOS parse write_chunk's date as ISO 8601; LoCoMo and LongMemEval write their own."""
    assert iso_date("1:56 pm on 8 May, 2023") == "2023-05-08T13:56:00"  # LoCoMo
    assert iso_date("2023/01/08 (Sun) 12:49") == "2023-01-08T12:49:00"  # LongMemEval
    assert iso_date("2024-03-01") == "2024-03-01" and iso_date("") == ""  # ISO kept as written; undated
    with pytest.raises(ValueError, match="not ISO 8601 and not a known source layout"):
        iso_date("next Tuesday")


def test_exact_match_is_refused_on_data_without_atomic_answers(tmp_path):
    """Silent failure string-rule-scoring: exact match scores only a manifest that declares answers_atomic."""
    from hymem_train.evaluation.matrix import plan_matrix

    class DS:
        root, tables = (
            tmp_path,
            {
                "eval_items": [
                    type("I", (), {"benchmark": "synthetic", "item_id": "s/q0", "sequence_id": "s"})()
                ]
            },
        )
        manifest = type(
            "M", (), {"answers_atomic": False, "eval_subsample": {"ids": {"synthetic": ["s/q0"]}}}
        )()

    import hymem_train.evaluation.matrix as mx

    cfg = MatrixConfig(
        harnesses={"native": HarnessConfig("native", in_process=True)}, data=EvalData(path=str(tmp_path))
    )
    orig, mx.BuiltDataset = mx.BuiltDataset, lambda root: DS
    try:
        with pytest.raises(ValueError, match="needs answers_atomic"):
            plan_matrix(cfg)
    finally:
        mx.BuiltDataset = orig
