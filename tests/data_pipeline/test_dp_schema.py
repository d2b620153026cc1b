"""Schema: strict round trips, errors that name where and the field, stored tables with explicit Features."""

from __future__ import annotations

import json
import shutil

import pytest
from datasets import load_from_disk

from data_pipeline import store
from data_pipeline.schema import (
    NO_SUCH_RECORD,
    SCHEMA_VERSION,
    Chunk,
    EvalItem,
    GoldFact,
    Manifest,
    OrmQuestion,
    Probe,
    ProbeKind,
    RecordError,
    Sequence,
    Session,
    Turn,
    Window,
)
from data_pipeline.store import FEATURES


def _probe(**kw):
    base = dict(
        probe_id="s/c0000/p000",
        sequence_id="s",
        chunk_index=0,
        kind="plain_recall",
        question="What is the name of Alice's dog?",
        reference="Rex",
        rubric="Full credit for Rex.",
    )
    base.update(kw)
    return Probe(**base)


def test_probe_kinds_are_the_reports_six():
    assert [k.value for k in ProbeKind] == [
        "specificity",
        "semantic_precision",
        "plain_recall",
        "minor_dimension",
        "transition",
        "should_not_store",
    ]


def test_round_trip_every_table():
    seq = Sequence("s", "src", [Session("session_1", "d", [Turn("D1:1", "A", "hi", image_caption="a cat")])])
    recs = {
        "sequences": seq,
        "chunks": Chunk("s", 0, seq.sessions[0].turns, "d", ["session_1"], 3),
        "windows": Window("s", 0, [0, 1, 2]),
        "probes": _probe(kind=ProbeKind.SHOULD_NOT_STORE, is_trap=True, reference=NO_SUCH_RECORD),
        "orm_questions": OrmQuestion(
            "s/w0000/q000", "s", 0, "q?", "a", [0, 1], [GoldFact("f", 1, "x", "a")], "r"
        ),
        "eval_items": EvalItem("s/q000", "b", "s", "q?", "a", "4", ["D1:1"], evidence_chunks=[0]),
    }
    for table, rec in recs.items():
        cls = type(rec)
        assert cls.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec
        assert set(rec.to_dict()) == set(FEATURES[table]), table


def test_errors_name_where_and_field():
    good = _probe().to_dict()
    with pytest.raises(RecordError, match=r"probes.jsonl:7: field 'chunk_index' must be an int"):
        Probe.from_dict({**good, "chunk_index": "3"}, where="probes.jsonl:7")
    with pytest.raises(RecordError, match=r"missing field 'rubric'"):
        Probe.from_dict({k: v for k, v in good.items() if k != "rubric"}, where="x")
    with pytest.raises(RecordError, match=r"unknown field\(s\) \['rubirc'\]"):
        Probe.from_dict({**good, "rubirc": "typo"}, where="x")
    with pytest.raises(RecordError, match=r"field 'kind' = 'recall' is not one of"):
        Probe.from_dict({**good, "kind": "recall"}, where="x")
    bad_seq = {
        "sequence_id": "s",
        "source": "x",
        "sessions": [{"session_id": "a", "date": "", "turns": [{}]}],
    }
    with pytest.raises(RecordError, match=r"missing field 'sessions\[0\].turns\[0\].turn_id'"):
        Sequence.from_dict(bad_seq, where="f.jsonl:3")


def test_invariants():
    with pytest.raises(ValueError, match="should_not_store must have is_trap"):
        _probe(kind=ProbeKind.SHOULD_NOT_STORE)
    with pytest.raises(ValueError, match="trap reference"):
        _probe(is_trap=True, reference="Rex")
    with pytest.raises(ValueError, match="6 chunks"):
        Window("s", 0, list(range(6)))
    with pytest.raises(ValueError, match="not consecutive"):
        Window("s", 0, [1, 3])
    with pytest.raises(ValueError, match="no gold facts"):
        OrmQuestion("q", "s", 0, "q", "a", [], [], "r")


def test_gold_facts_by_chunk():
    q = OrmQuestion(
        "q", "s", 1, "q", "a", [3, 5], [GoldFact("a", 5), GoldFact("b", 3), GoldFact("c", 5)], "r"
    )
    assert {k: [g.fact for g in v] for k, v in q.gold_facts_by_chunk().items()} == {5: ["a", "c"], 3: ["b"]}


def test_store_round_trip_with_features(tmp_path):
    probes = [_probe(probe_id=f"s/c0000/p{i:03d}") for i in range(3)]
    out = store.write_dataset(
        tmp_path / "ds", {"probes": probes, "windows": []}, Manifest("t", ["synthetic"])
    )
    assert store.read_table(out, "probes") == probes
    assert store.read_table(out, "windows") == []
    assert load_from_disk(str(out / "probes")).features == FEATURES["probes"]
    m = store.read_manifest(out)
    assert m.counts == {"probes": 3, "windows": 0} and m.schema_version == SCHEMA_VERSION


def test_store_nothing_half_written(tmp_path):
    target = tmp_path / "ds"
    store.write_dataset(target, {"probes": [_probe()]}, Manifest("v1", ["a"]))

    bad = [_probe(), "not a record"]
    with pytest.raises(TypeError):
        store.write_dataset(target, {"probes": bad}, Manifest("v2", ["a"]))
    # the previous version is intact and no temp directory is left behind
    assert store.read_manifest(target).name == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_read_table_names_row_on_bad_stored_record(tmp_path):
    out = store.write_dataset(tmp_path / "ds", {"probes": [_probe()]}, Manifest("t", ["a"]))
    ds = load_from_disk(str(out / "probes")).map(lambda r: {"kind": "bogus"})
    ds.save_to_disk(str(tmp_path / "tmp_probes"))

    shutil.rmtree(out / "probes")
    shutil.move(str(tmp_path / "tmp_probes"), str(out / "probes"))
    with pytest.raises(RecordError, match=r"probes\[0\] \(s/c0000/p000\): field 'kind' = 'bogus'"):
        store.read_table(out, "probes")
