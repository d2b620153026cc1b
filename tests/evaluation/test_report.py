"""The matrix's tables: failures excluded and counted, harness and overall means, paired intervals,
held-out columns marked; and the judge replies' strict parsing (an off-contract reply is a failure)."""

import math

import pytest

from hymem_train.evaluation.report import build_table, to_markdown
from reward.eval_protocol import (
    longmemeval_judge_messages,
    metric_for,
    parse_locomo_label,
    parse_yes_no,
    token_f1,
)
from reward.llm import ParseError


def rec(w, h, m, i, score=None, fail=False, cat="1"):
    r = {"writer": w, "harness": h, "metric": m, "item_id": f"q{i}", "category": cat}
    if fail:
        r["failure"] = {"stage": "bank_build", "detail": "x"}
    else:
        r["score"] = score
    return r


def test_failures_are_excluded_and_counted_and_means_compose():
    recs = [rec("a", "mem0", "LoCoMo Judge", i, s) for i, s in enumerate([1, 0, 1, 1])]
    recs += [rec("a", "mem0", "LongMemEval", i, s) for i, s in enumerate([0, 0])]
    recs += [rec("a", "mem0", "LongMemEval", 9, fail=True)]
    recs += [rec("a", "everos", "LoCoMo Judge", i, 1) for i in range(3)]
    t = build_table(recs, ["a"], ["mem0", "everos"], {"mem0": False, "everos": True}, resamples=300)
    c = t.cells[("a", "mem0", "LongMemEval")]
    assert (c.mean, c.n, c.failures) == (0.0, 2, 1)  # the failed item is not a 0 in the mean
    assert t.cells[("a", "mem0", "LoCoMo Judge")].mean == 75.0
    assert t.harness_scores[("a", "mem0")].mean == pytest.approx((75.0 + 0.0) / 2)
    assert t.average["a"].mean == pytest.approx(((75.0 + 0.0) / 2 + 100.0) / 2)
    md = to_markdown(t, [])
    assert "everos (held out)" in md and "(1 failed)" in md
    assert "mean over 2 metric(s) that ran (2 of the report's 6)" in md


def test_paired_difference_is_a_tie_only_when_its_interval_holds_zero():
    n = 60
    same = [rec(w, "native", "LoCoMo Judge", i, i % 2) for w in ("a", "b") for i in range(n)]
    t = build_table(same, ["a", "b"], ["native"], {}, resamples=500)
    d = t.diffs[("a", "b", "Average")]
    assert d.mean == 0 and d.lo <= 0 <= d.hi
    better = [rec("a", "native", "LoCoMo Judge", i, 1) for i in range(n)]
    better += [rec("b", "native", "LoCoMo Judge", i, 1 if i < n // 2 else 0) for i in range(n)]
    t = build_table(better, ["a", "b"], ["native"], {}, resamples=500)
    d = t.diffs[("a", "b", "Average")]
    assert (
        d.mean == 50.0 and d.lo > 0 and "tie" not in to_markdown(t, []).split("| a - b |")[1].split("\n")[0]
    )


def test_all_failed_cell_is_nan_not_zero():
    recs = [rec("a", "native", "LoCoMo Judge", i, fail=True) for i in range(3)]
    t = build_table(recs, ["a"], ["native"], {}, resamples=50)
    c = t.cells[("a", "native", "LoCoMo Judge")]
    assert c.n == 0 and c.failures == 3 and math.isnan(c.mean)
    assert "failed (3)" in to_markdown(t, [])


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
    from data_pipeline.chunking import iso_date

    assert iso_date("1:56 pm on 8 May, 2023") == "2023-05-08T13:56:00"  # LoCoMo
    assert iso_date("2023/01/08 (Sun) 12:49") == "2023-01-08T12:49:00"  # LongMemEval
    assert iso_date("2024-03-01") == "2024-03-01" and iso_date("") == ""  # ISO kept as written; undated
    with pytest.raises(ValueError, match="not ISO 8601 and not a known source layout"):
        iso_date("next Tuesday")


def test_exact_match_is_refused_on_data_without_atomic_answers(tmp_path):
    """Silent failure string-rule-scoring: exact match scores only a manifest that declares answers_atomic."""
    from hymem_train.evaluation.config import EvalData, MatrixConfig
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
    from harnesses.registry import HarnessConfig

    cfg = MatrixConfig(
        harnesses={"native": HarnessConfig("native", in_process=True)}, data=EvalData(path=str(tmp_path))
    )
    orig, mx.BuiltDataset = mx.BuiltDataset, lambda root: DS
    try:
        with pytest.raises(ValueError, match="needs answers_atomic"):
            plan_matrix(cfg)
    finally:
        mx.BuiltDataset = orig
