"""Judge validation (reward/judge_validation.py) through the reward LLM judge against a stand-in endpoint."""

from __future__ import annotations

import json
import re

import pytest

from data_pipeline.build import main as build_main
from data_pipeline.synthetic import SyntheticConfig, generate
from data_pipeline.typed_config import ConfigError
from reward.judge_validation import (
    REFUSAL,
    JudgeValidationConfig,
    build_items,
    endpoint_judge,
    format_report,
    main,
    validate_judge,
)
from tests.doubles.openai_server import StandInServer


@pytest.fixture(scope="module")
def data():
    return generate(SyntheticConfig(num_sequences=3, num_chunks_per_sequence=10))


def _field(text, name):
    return re.search(rf"^{name}: (.*)$", text, flags=re.M).group(1)


def scripted_judge(refusal_score=0.0, broken=False):
    """A test double of a judge model: grades the five synthetic answer shapes it is shown."""

    def respond(body):
        user = body["messages"][1]["content"]
        cand = user.split("Candidate answer: ", 1)[1]
        ref = _field(user, "Reference answer")
        if broken and "notes" in cand and "nothing on the rest" not in cand:
            return "The answer looks right to me."  # not the JSON contract -> Fault after retries
        if cand == ref or cand.startswith("According to my notes") and "nothing on the rest" not in cand:
            score = 1.0
        elif "nothing on the rest" in cand:
            score = 0.5
        elif cand == REFUSAL:
            score = refusal_score
        else:
            score = 0.0
        if "Gold facts:" in user:
            n = len(re.findall(r"^\d+\. ", user, flags=re.M))
            rec = list(range(1, n + 1)) if score == 1.0 else ([1] if score == 0.5 else [])
            return json.dumps({"score": score, "recovered": rec})
        return json.dumps({"score": score})

    return respond


def _cfg(url, **kw):
    return JudgeValidationConfig(
        **{"enabled": True, "base_url": url, "model": "judge", "num_items": 30, **kw}
    )


def test_items_have_the_five_answers(data):
    items = build_items(data.probes, data.orm_questions, data.facts, 1000, seed=0)
    assert not any(it.item_id in {p.probe_id for p in data.probes if p.is_trap} for it in items)
    orm = [it for it in items if it.kind == "orm"]
    assert orm and all(
        set(it.answers) == {"reference", "paraphrase", "partial", "distractor", "refusal"} for it in orm
    )
    for it in items:
        assert it.answers["distractor"] != it.reference and it.answers["refusal"] == REFUSAL
        # a faithful paraphrase restates the supporting facts, not the reference string itself
        assert it.answers["paraphrase"] != it.reference and all(
            f.rstrip(".") in it.answers["paraphrase"] for f in it.gold_facts
        )
    assert build_items(data.probes, data.orm_questions, data.facts, 20, seed=1) == build_items(
        data.probes, data.orm_questions, data.facts, 20, seed=1
    )


def test_good_judge_ranks_as_expected(data):
    with StandInServer(scripted_judge()) as srv:
        report = validate_judge(
            endpoint_judge(_cfg(srv.base_url)),
            data.probes,
            data.orm_questions,
            data.facts,
            _cfg(srv.base_url),
        )
        assert len(srv.chat_bodies()) == sum(len(r["scores"]) for r in report["items"])
    assert report["num_items"] == 30 and report["num_faults"] == 0
    assert report["share_ranked_as_expected"] == 1.0
    assert report["mean_paraphrase_score"] == 1.0 and report["report_pilot_paraphrase_score"] == 0.90
    assert report["mean_score_by_answer"]["partial"] == 0.5
    assert "| refusal | zero | 0.00 | 1.00 |" in format_report(report)


def test_bad_judge_is_flagged(data):
    with StandInServer(scripted_judge(refusal_score=0.6)) as srv:
        cfg = _cfg(srv.base_url)
        report = validate_judge(endpoint_judge(cfg), data.probes, data.orm_questions, data.facts, cfg)
    assert report["share_ranked_as_expected"] == 0.0
    assert (
        report["agreement_by_answer"]["refusal"] == 0.0 and report["agreement_by_answer"]["reference"] == 1.0
    )
    assert all(not r["as_expected"] and r["grades"]["refusal"] == "partial" for r in report["items"])


def test_judge_faults_are_excluded_not_scored(data):
    with StandInServer(scripted_judge(broken=True)) as srv:
        cfg = _cfg(srv.base_url, num_items=6)
        judge = endpoint_judge(cfg)
        judge.client.cfg.retry_backoff_s = 0.0
        report = validate_judge(judge, data.probes, data.orm_questions, data.facts, cfg)
    # every paraphrase verdict broke the contract: 6 faults, no item complete, no paraphrase mean
    assert report["num_faults"] == 6 and report["num_items_scored"] == 0
    assert report["mean_paraphrase_score"] is None and report["share_ranked_as_expected"] is None
    assert report["mean_score_by_answer"]["reference"] == 1.0


def test_build_with_judge_validation_writes_the_report(tmp_path, capsys):
    """`python -m reward.judge_validation` = the data build with this judge passed in; the plain data
    build (which does not import reward) refuses judge_validation.enabled=true before any work."""
    with StandInServer(scripted_judge()) as srv:
        over = ["data.synthetic.num_sequences=3", "judge_validation.enabled=true"]
        over += [f"judge_validation.base_url={srv.base_url}", "judge_validation.model=judge"]
        # one line and exit 2 (the build's user errors); --debug raises the ConfigError itself
        assert build_main([f"out_dir={tmp_path / 'plain'}", *over]) == 2
        assert "python -m reward.judge_validation" in capsys.readouterr().err
        with pytest.raises(ConfigError, match="python -m reward.judge_validation"):
            build_main([f"out_dir={tmp_path / 'plain'}", *over, "--debug"])
        assert not srv.requests and not (tmp_path / "plain").exists()
        assert main([f"out_dir={tmp_path / 'judged'}", *over, "judge_validation.num_items=10"]) == 0
    root = tmp_path / "judged" / "hy_memory"
    report = json.loads((root / "judge_validation.json").read_text())
    assert report["num_items"] == 10 and report["share_ranked_as_expected"] == 1.0
    assert (root / "judge_validation.md").read_text() == format_report(report) + "\n"
