"""Annotation passes against a stand-in OpenAI-compatible server: validation, retry, resume, failure record."""

from __future__ import annotations

import json

import pytest

from data_pipeline.annotate import AnnotatorConfig, annotate, parse_json_answer
from data_pipeline.chunking import build_windows
from data_pipeline.schema import NO_SUCH_RECORD, ProbeKind
from data_pipeline.synthetic import SyntheticConfig, generate
from tests.doubles.annotator import annotator_responder as responder
from tests.doubles.annotator import good_prm
from tests.doubles.openai_server import StandInServer


@pytest.fixture(scope="module")
def corpus():
    d = generate(SyntheticConfig(num_sequences=2, num_chunks_per_sequence=7))
    return d.chunks, build_windows(d.chunks, 5)


def _cfg(url, **kw):
    base = dict(base_url=url, model="annotator", num_retries=2, num_transport_retries=0, progress=False)
    base.update(kw)
    return AnnotatorConfig(**base)


def test_valid_run_attributes_gold_facts_by_fact_id(corpus, tmp_path):
    chunks, windows = corpus
    with StandInServer(responder()) as srv:
        res = annotate(chunks, windows, _cfg(srv.base_url, num_workers=2), tmp_path)
        # one call per chunk + one per window, with guided-decoding schema attached
        assert len(srv.chat_bodies()) == len(chunks) + len(windows) == res.num_calls
        assert all(r["response_format"]["type"] == "json_schema" for r in srv.chat_bodies())
    assert res.failures == [] and (tmp_path / "failures.jsonl").read_text() == ""
    assert len(res.facts) == len(chunks)
    traps = [p for p in res.probes if p.is_trap]
    assert len(traps) == len(chunks) and all(
        p.kind is ProbeKind.SHOULD_NOT_STORE and p.reference == NO_SUCH_RECORD for p in traps
    )
    assert any(p.kind is ProbeKind.TRANSITION for p in res.probes)
    facts = {f.fact_id: f for f in res.facts}
    assert any(f.supersedes for f in res.facts)
    assert len(res.orm_questions) == len(windows)
    for q in res.orm_questions:
        for g in q.gold_facts:
            # attribution comes from the cited Fact row, not from anything the annotator said
            assert g.source_chunk == facts[g.fact_id].chunk_index and g.fact == facts[g.fact_id].text


def test_prm_context_is_facts_of_two_previous_chunks(corpus, tmp_path):
    chunks, windows = corpus
    with StandInServer(responder()) as srv:
        annotate(chunks, windows, _cfg(srv.base_url, num_workers=1), tmp_path)
        prm = [
            json.loads(r["messages"][1]["content"])
            for r in srv.chat_bodies()
            if "(PRM pass" in r["messages"][0]["content"]
        ]
    for p in prm:
        t = p["chunk_index"]
        assert sorted({f["chunk_index"] for f in p["previous_facts"]}) == list(range(max(0, t - 2), t))


def test_malformed_answers_retried_then_recorded(corpus, tmp_path):
    chunks, windows = corpus
    seq0 = chunks[0].sequence_id

    def script(which, p, attempt):
        if p["sequence_id"] != seq0:
            return None
        if which == "prm" and p["chunk_index"] == 1 and attempt == 0:
            return '{"facts": [ truncated'  # not JSON -> retried
        if which == "prm" and p["chunk_index"] == 2:  # always schema-invalid -> recorded failure
            bad = good_prm(p)
            bad["probes"][0]["kind"] = "recall"
            bad["extra"] = 1
            return bad
        if which == "prm" and p["chunk_index"] == 3 and attempt == 0:
            bad = good_prm(p)
            bad["facts"][0]["turn_ids"] = ["D99:1"]  # schema-valid, but not a turn of this chunk
            return bad
        if which == "prm" and p["chunk_index"] == 4 and attempt == 0:
            return "```json\n" + json.dumps(good_prm(p)) + "\n```"  # one fenced block is accepted
        if which == "orm" and p["window_index"] == 0 and attempt < 2:
            return {"questions": [{"question": "q", "answer": "a", "gold_fact_ids": ["nope"], "rubric": "r"}]}
        return None

    with StandInServer(responder(script)) as srv:
        res = annotate(chunks, windows, _cfg(srv.base_url, num_workers=1), tmp_path)
        retries = [r for r in srv.chat_bodies() if len(r["messages"]) > 2]
    (fail,) = res.failures
    assert (fail.pass_name, fail.sequence_id, fail.unit, fail.kind) == (
        "prm",
        seq0,
        "chunk 2",
        "invalid_answer",
    )
    assert len(fail.errors) == 3 and all("schema" in e for e in fail.errors)
    assert "probes.0.kind" in fail.errors[0] and "extra" in fail.errors[0]
    # the failure record on disk names the same call
    (rec,) = [json.loads(x) for x in (tmp_path / "failures.jsonl").read_text().splitlines()]
    assert rec["unit"] == "chunk 2" and rec["key"] == fail.key and '"recall"' in rec["last_content"]
    # the re-ask carries the validation error back to the annotator
    assert any("not valid JSON" in r["messages"][-1]["content"] for r in retries)
    assert any("not turns of this chunk" in r["messages"][-1]["content"] for r in retries)
    assert any("not given fact_ids" in r["messages"][-1]["content"] for r in retries)
    # the failed chunk has no annotations; the retried ones do
    got = {(p.sequence_id, p.chunk_index) for p in res.probes}
    assert (seq0, 2) not in got and {(seq0, 1), (seq0, 3), (seq0, 4)} <= got
    assert {q.window_index for q in res.orm_questions if q.sequence_id == seq0} == {0, 1}
    # paid calls: 1 per unit + 1 (chunk 1) + 2 (chunk 2) + 1 (chunk 3) + 2 (window 0)
    assert res.num_calls == len(chunks) + len(windows) + 6


def test_resume_and_cache_do_not_repay_finished_calls(corpus, tmp_path):
    chunks, windows = corpus
    seq1 = chunks[-1].sequence_id

    def outage(which, p, attempt):  # server errors for the second sequence from chunk 4 on
        if p["sequence_id"] == seq1 and (which == "orm" or p["chunk_index"] >= 4):
            return 503
        return None

    with StandInServer(responder(outage)) as srv:
        first = annotate(chunks, windows, _cfg(srv.base_url), tmp_path)
    assert first.failures and all(f.kind == "platform" and f.sequence_id == seq1 for f in first.failures)
    assert "503" in first.failures[0].errors[0]

    with StandInServer(responder()) as srv:
        second = annotate(chunks, windows, _cfg(srv.base_url), tmp_path)
        paid = [json.loads(r["messages"][1]["content"]) for r in srv.chat_bodies()]
    assert second.failures == []
    # only what failed (and what depends on it) is paid again: nothing of the first sequence
    assert paid and all(p["sequence_id"] == seq1 for p in paid)
    assert all(p.get("chunk_index", 99) >= 4 for p in paid)
    assert second.num_cached == len(chunks) + len(windows) - len(paid)

    with StandInServer(responder()) as srv:
        third = annotate(chunks, windows, _cfg(srv.base_url), tmp_path)
        assert srv.chat_bodies() == []  # a finished run costs nothing to repeat
    assert (third.facts, third.probes, third.orm_questions) == (
        second.facts,
        second.probes,
        second.orm_questions,
    )

    # a crash mid-write leaves a torn last line: it is skipped, only that call is paid again
    calls = tmp_path / "calls.jsonl"
    text = calls.read_text()
    calls.write_text(text[: len(text) - 40])
    with StandInServer(responder()) as srv:
        fourth = annotate(chunks, windows, _cfg(srv.base_url), tmp_path)
        assert len(srv.chat_bodies()) == 1
    assert fourth.probes == second.probes
    assert len(calls.read_text().splitlines()) == len(text.splitlines()) + 1


def test_parse_json_answer_is_strict():
    assert parse_json_answer(' {"a": 1} ') == {"a": 1}
    assert parse_json_answer('```json\n{"a": 1}\n```') == {"a": 1}
    for bad in [None, "", 'Sure! {"a": 1}', '{"a": 1} trailing', "```json\n{}\n``` extra"]:
        with pytest.raises(ValueError):
            parse_json_answer(bad)
