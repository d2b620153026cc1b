"""Loaders on the bundled slices (tests/fixtures/sample_data): counts match the files, every evidence id resolves or is reported."""

from __future__ import annotations

import collections
import json
import re

import pytest

from data_pipeline.loaders import LOCOMO_CATEGORIES, load_generic_jsonl, load_locomo, load_longmemeval
from data_pipeline.schema import RecordError


def _raw_locomo_counts(path):
    out = {}
    for s in json.loads(path.read_text()):
        conv = s["conversation"]
        sess = [k for k in conv if re.fullmatch(r"session_\d+", k)]
        out[s["sample_id"]] = {
            "sessions": len(sess),
            "turns": sum(len(conv[k]) for k in sess),
            "qa": len(s["qa"]),
            "categories": collections.Counter(str(q["category"]) for q in s["qa"]),
        }
    return out


def test_locomo_counts_match_file(locomo_path):
    raw = _raw_locomo_counts(locomo_path)
    # the two conversations of the bundled slice (facts of the file, see tests/fixtures/sample_data/README.md)
    assert {k: (v["sessions"], v["turns"], v["qa"]) for k, v in raw.items()} == {
        "conv-26": (19, 419, 199),
        "conv-30": (19, 369, 105),
    }
    res = load_locomo(locomo_path)
    assert [s.sequence_id for s in res.sequences] == ["locomo/conv-26", "locomo/conv-30"]
    for seq in res.sequences:
        want = raw[seq.sequence_id.split("/")[1]]
        assert len(seq.sessions) == want["sessions"]
        assert len(seq.turns()) == want["turns"]
        items = [i for i in res.eval_items if i.sequence_id == seq.sequence_id]
        assert len(items) == want["qa"]
        assert collections.Counter(i.category for i in items) == want["categories"]
        assert set(want["categories"]) <= set(LOCOMO_CATEGORIES)
        # sessions in numeric order, with their dates
        assert [s.session_id for s in seq.sessions] == [f"session_{i}" for i in range(1, 20)]
        assert all(s.date for s in seq.sessions)
    # category 5 (adversarial) items are natural traps carrying the baited answer
    adv = [i for i in res.eval_items if i.category == "5"]
    assert len(adv) == 47 + 24 and all(i.is_trap and i.adversarial_answer for i in adv)
    assert not any(i.is_trap for i in res.eval_items if i.category != "5")
    # integer answers (e.g. 2022) become text, never None
    assert all(isinstance(i.answer, str) for i in res.eval_items)
    # observations become seed facts tied to real turns
    known = {(s.sequence_id, t.turn_id) for s in res.sequences for t in s.turns()}
    assert res.seed_facts and all((f.sequence_id, t) in known for f in res.seed_facts for t in f.turn_ids)


def test_locomo_every_evidence_id_resolves_or_is_reported(locomo_path):
    res = load_locomo(locomo_path)
    data = {s["sample_id"]: s for s in json.loads(locomo_path.read_text())}
    turn_ids = {s.sequence_id: {t.turn_id for t in s.turns()} for s in res.sequences}
    reported = collections.defaultdict(list)
    for iss in res.issues:
        reported[iss.item_id].append(iss.raw)
    for item in res.eval_items:
        k = int(item.item_id.rsplit("/q", 1)[1])
        raw_qa = data[item.sequence_id.split("/")[1]]["qa"][k]
        assert raw_qa["question"] == item.question
        assert set(item.evidence_turn_ids) <= turn_ids[item.sequence_id]
        for raw in raw_qa["evidence"]:
            assert raw in item.evidence_turn_ids or raw in reported[item.item_id], (item.item_id, raw)
        if not raw_qa["evidence"]:
            assert "" in reported[item.item_id]
    # the known malformed string of conv-26 is reported with its question and both ids recovered
    (bad,) = [i for i in res.issues if i.raw == "D8:6; D9:17"]
    assert bad.sample_id == "conv-26" and bad.question == "What did Melanie paint recently?"
    assert bad.resolved == ["D8:6", "D9:17"]
    assert str(locomo_path) == bad.file


def _tiny_locomo(tmp_path, evidence, turn=None):
    turn = turn or {"speaker": "A", "dia_id": "D1:1", "text": "hi"}
    sample = {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "A",
            "speaker_b": "B",
            "session_1_date_time": "d1",
            "session_1": [turn],
        },
        "qa": [{"question": "Q?", "answer": "a", "evidence": evidence, "category": 1}],
    }
    p = tmp_path / "locomo10.json"
    p.write_text(json.dumps([sample]))
    return p


def test_locomo_malformed_evidence_reported_not_dropped(tmp_path, caplog):
    p = _tiny_locomo(tmp_path, ["D1:1", "D", "D8:6; D1:1", "D9:9", "D1:01"])
    res = load_locomo(p)
    item = res.eval_items[0]
    assert item.evidence_turn_ids == ["D1:1"]
    reasons = {i.raw: i.reason for i in res.issues}
    assert set(reasons) == {"D", "D8:6; D1:1", "D9:9", "D1:01"}
    assert "malformed" in reasons["D"] and "resolves to no turn" in reasons["D9:9"]
    assert "unresolved: ['D8:6']" in reasons["D8:6; D1:1"]
    assert "zero-padded" in reasons["D1:01"]
    assert len(item.evidence_issues) == 4
    assert all(i.question == "Q?" and i.sample_id == "conv-x" for i in res.issues)
    assert "conv-x" in caplog.text and "'D9:9'" in caplog.text


def test_locomo_bad_records_name_file_record_and_field(tmp_path):
    p = _tiny_locomo(tmp_path, ["D1:1"], turn={"speaker": "A", "dia_id": "D1:1", "text": 5})
    with pytest.raises(
        RecordError, match=r"locomo10.json sample conv-x: field 'conversation.session_1\[0\].text'"
    ):
        load_locomo(p)
    p = _tiny_locomo(tmp_path, ["D1:1"], turn={"speaker": "A", "dia_id": "D1:1"})
    with pytest.raises(RecordError, match=r"sample conv-x: missing field 'conversation.session_1\[0\].text'"):
        load_locomo(p)
    text = p.read_text()
    p.write_text(text[: len(text) // 2])
    with pytest.raises(RecordError, match=r"locomo10.json: not valid JSON \(truncated\?\)"):
        load_locomo(p)


def test_longmemeval_counts_match_file(longmemeval_path):
    raw = json.loads(longmemeval_path.read_text())
    res = load_longmemeval(longmemeval_path)
    assert len(res.sequences) == len(res.eval_items) == len(raw) == 8
    assert collections.Counter(i.category for i in res.eval_items) == collections.Counter(
        q["question_type"] for q in raw
    )
    for q, seq, item in zip(raw, res.sequences, res.eval_items, strict=True):
        assert len(seq.sessions) == len(q["haystack_sessions"])
        assert len(seq.turns()) == sum(len(s) for s in q["haystack_sessions"])
        assert [s.date for s in seq.sessions] == q["haystack_dates"]
        assert item.evidence_session_ids == q["answer_session_ids"]  # all resolve in this slice
        n_has = sum(t.get("has_answer", False) for s in q["haystack_sessions"] for t in s)
        assert len(item.evidence_turn_ids) == n_has
    assert res.issues == []


def test_longmemeval_unresolved_session_reported_and_mismatch_named(tmp_path, longmemeval_path):
    raw = json.loads(longmemeval_path.read_text())[:1]
    raw[0]["answer_session_ids"].append("nope")
    p = tmp_path / "longmemeval_s.json"
    p.write_text(json.dumps(raw))
    res = load_longmemeval(p)
    assert [(i.raw, i.reason) for i in res.issues] == [("nope", "session id not in haystack")]
    raw[0]["haystack_dates"].pop()
    p.write_text(json.dumps(raw))
    with pytest.raises(RecordError, match=rf"question {raw[0]['question_id']}: field 'haystack_sessions'"):
        load_longmemeval(p)


def test_generic_jsonl(tmp_path):
    seq = {
        "sequence_id": "pm/1",
        "source": "personamem_v2",
        "sessions": [
            {"session_id": "s1", "date": "d", "turns": [{"turn_id": "t1", "speaker": "u", "text": "x"}]}
        ],
        "qa": [
            {
                "question": "q",
                "answer": "a",
                "evidence_turn_ids": ["t1", "t9"],
                "evidence_session_ids": ["s1"],
            }
        ],
    }
    p = tmp_path / "pm.jsonl"
    p.write_text(json.dumps(seq) + "\n")
    res = load_generic_jsonl(p)
    assert res.eval_items[0].evidence_turn_ids == ["t1"]
    assert [(i.raw, i.item_id) for i in res.issues] == [("t9", "pm/1/q000")]
    seq["sessions"][0]["turns"][0]["text"] = None
    p.write_text("\n" + json.dumps(seq) + "\n")
    with pytest.raises(
        RecordError, match=r"pm.jsonl:2 \(sequence pm/1\): field 'sessions\[0\].turns\[0\].text'"
    ):
        load_generic_jsonl(p)
    p.write_text(json.dumps(seq)[:40] + "\n")
    with pytest.raises(RecordError, match=r"pm.jsonl:1: not valid JSON"):
        load_generic_jsonl(p)
