"""Synthetic working (tool calls) and coding (diffs) episodes, mixed by `SyntheticConfig.mix`,
with gold facts, probes, traps and ORM questions by construction; the default (chat alone)
output is byte-identical to the generator before these kinds existed."""

from __future__ import annotations

import hashlib
import json

import pytest

from data_pipeline.build import build, load_config
from data_pipeline.schema import NO_SUCH_RECORD, ProbeKind
from data_pipeline.store import BuiltDataset
from data_pipeline.synthetic import SyntheticConfig, generate, sequence_kinds

# sha256 of the generator's output before the working / coding kinds existed (commit 057562a)
BEFORE = {
    "default": "07e0b7810733abe14068b9dea4dc04428f7b71a4efd6629ee62ea4e27ed57d64",
    "13seq_seed3_recurring": "77101479501f74baa38593cc4b872ddc87d984126064de7d7dfe5e039bba5e53",
}


def _sha(cfg: SyntheticConfig) -> str:
    d = generate(cfg)
    blob = json.dumps({k: [r.to_dict() for r in v] for k, v in d.tables().items()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def test_default_output_is_byte_identical_to_before():
    assert _sha(SyntheticConfig()) == BEFORE["default"]
    recurring = dict(num_sequences=13, seed=3, unique_person_names=False)
    assert _sha(SyntheticConfig(**recurring)) == BEFORE["13seq_seed3_recurring"]
    assert _sha(SyntheticConfig(**recurring, mix={"chat": 1.0})) == BEFORE["13seq_seed3_recurring"]


def test_mix_apportions_sequences_deterministically():
    cfg = SyntheticConfig(num_sequences=7, mix={"chat": 0.5, "working": 0.25, "coding": 0.25})
    kinds = sequence_kinds(cfg)
    assert sorted(kinds) == ["chat"] * 3 + ["coding"] * 2 + ["working"] * 2 and kinds == sequence_kinds(cfg)
    assert sequence_kinds(SyntheticConfig(num_sequences=3, mix={"coding": 2.0})) == ["coding"] * 3
    with pytest.raises(ValueError, match="synthetic.mix"):
        sequence_kinds(SyntheticConfig(mix={"email": 1.0}))
    a = generate(SyntheticConfig(num_sequences=4, mix={"working": 1, "coding": 1}, seed=2))
    assert (
        a.tables()
        == generate(SyntheticConfig(num_sequences=4, mix={"working": 1, "coding": 1}, seed=2)).tables()
    )


def _turns(d):
    return {(s.sequence_id, t.turn_id): t for s in d.sequences for ss in s.sessions for t in ss.turns}


@pytest.mark.parametrize("kind", ["working", "coding"])
def test_agent_episodes_carry_gold_by_construction(kind):
    d = generate(
        SyntheticConfig(num_sequences=3, num_chunks_per_sequence=12, mix={kind: 1.0}, update_prob=0.6)
    )
    turns, facts = _turns(d), {f.fact_id: f for f in d.facts}
    carrier = "tool" if kind == "working" else "assistant"
    assert {s.source for s in d.sequences} == {f"synthetic_{kind}"}
    for p in d.probes:
        if p.is_trap:  # transient tool output: a good bank stores none of it
            assert p.kind == ProbeKind.SHOULD_NOT_STORE and p.reference == NO_SUCH_RECORD and not p.fact_ids
            continue
        [f] = [facts[i] for i in p.fact_ids]
        [tid] = f.turn_ids
        t = turns[(f.sequence_id, tid)]
        assert t.speaker == carrier and p.reference in t.text, (p.question, t.text)
        assert tid.startswith(f"D{p.chunk_index + 1}:") and f.chunk_index == p.chunk_index
        if kind == "coding":
            assert "```diff" in t.text and "+" in t.text
    updates = [p for p in d.probes if p.kind == ProbeKind.TRANSITION]
    assert updates, "update_prob=0.6 over 12 chunks gives changed facts"
    for p in updates:
        new = facts[p.fact_ids[0]]
        old = facts[new.supersedes]
        assert old.chunk_index < new.chunk_index
        if kind == "coding":  # the diff replaces the old value with the new one
            text = turns[(new.sequence_id, new.turn_ids[0])].text
            assert "+" in text and p.reference in text.split("\n+")[-1]
    assert sum(p.is_trap for p in d.probes) > 0 and d.orm_questions
    for q in d.orm_questions:
        for g in q.gold_facts:
            assert facts[g.fact_id].chunk_index == g.source_chunk in q.evidence_chunks and g.answer


def test_build_writes_a_working_dataset(tmp_path):
    cfg = load_config(
        [
            f"out_dir={tmp_path}",
            "data.synthetic.num_sequences=2",
            "data.synthetic.num_chunks_per_sequence=4",
            "data.synthetic.num_chunks_per_window=2",
            "data.profiles.hy_memory.num_chunks_per_window=2",
            "+data.synthetic.mix.working=1.0",
        ]
    )
    ds = BuiltDataset(build(cfg)[0]["hy_memory"])
    assert ds.manifest.answers_atomic and len(ds.windows) == 4
    assert {s.source for s in ds.tables["sequences"]} == {"synthetic_working"}
    assert any(t.speaker == "tool" for c in ds.tables["chunks"] for t in c.turns)
