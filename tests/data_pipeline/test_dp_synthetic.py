"""Synthetic generator: deterministic, short chunks, atomic facts, updates, traps, attributed gold facts."""

from __future__ import annotations

import re

from data_pipeline.chunking import render_chunk
from data_pipeline.schema import MAX_WINDOW_CHUNKS, NO_SUCH_RECORD, ProbeKind
from data_pipeline.synthetic import CHITCHAT, FRIENDS, SLOTS, SyntheticConfig, generate, pretraining_documents


def _data(**kw):
    return generate(SyntheticConfig(num_sequences=6, num_chunks_per_sequence=12, **kw))


def test_deterministic_and_seeded():
    a, b = _data(seed=3), _data(seed=3)
    assert a.tables() == b.tables()
    assert _data(seed=4).probes != a.probes


def test_chunks_short_and_windows_bounded():
    d = _data()
    assert len(d.chunks) == 6 * 12
    assert max(len(render_chunk(c).split()) for c in d.chunks) < 60
    assert all(1 <= len(w.chunk_indices) <= MAX_WINDOW_CHUNKS for w in d.windows)


def test_probes_grounded_in_their_chunk():
    d = _data()
    chunks = {(c.sequence_id, c.index): c for c in d.chunks}
    facts = {f.fact_id: f for f in d.facts}
    kinds = {p.kind for p in d.probes}
    assert kinds == set(ProbeKind)  # all six kinds occur
    for p in d.probes:
        text = render_chunk(chunks[(p.sequence_id, p.chunk_index)])
        if p.is_trap:
            assert p.kind is ProbeKind.SHOULD_NOT_STORE and p.reference == NO_SUCH_RECORD and not p.fact_ids
            continue
        # atomic: a single short span, stated verbatim in the probe's own chunk, by the fact it tests
        assert len(p.reference.split()) <= 2 and p.reference in text
        (fid,) = p.fact_ids
        assert facts[fid].chunk_index == p.chunk_index and p.reference in facts[fid].text
        if p.kind is ProbeKind.TRANSITION:
            old = facts[facts[fid].supersedes]
            assert old.chunk_index < p.chunk_index and old.sequence_id == p.sequence_id


def test_updates_replace_old_state():
    d = _data(update_prob=0.9)
    updates = [f for f in d.facts if f.supersedes]
    assert updates
    by_id = {f.fact_id: f for f in d.facts}
    for f in updates:
        assert by_id[f.supersedes].text != f.text
    # the end-of-stream evaluation asks for the new value, never the superseded one
    for item in d.eval_items:
        if item.category == "transition":
            (c,) = item.evidence_chunks
            assert any(f.supersedes and f.chunk_index == c and item.answer in f.text for f in d.facts)


def test_orm_gold_facts_attributed_to_source_chunk():
    d = _data()
    assert d.orm_questions
    facts = {f.fact_id: f for f in d.facts}
    windows = {(w.sequence_id, w.index): w for w in d.windows}
    for q in d.orm_questions:
        w = windows[(q.sequence_id, q.window_index)]
        assert len(q.gold_facts) >= 2 and len({g.source_chunk for g in q.gold_facts}) >= 2  # cross-chunk
        assert any(g.source_chunk in w.chunk_indices for g in q.gold_facts)
        assert all(g.source_chunk <= w.chunk_indices[-1] for g in q.gold_facts)  # no future facts
        for g in q.gold_facts:
            f = facts[g.fact_id]
            assert (f.chunk_index, f.text) == (g.source_chunk, g.fact) and g.answer in g.fact
        assert q.evidence_chunks == sorted({g.source_chunk for g in q.gold_facts})
        assert all(g.answer in q.answer for g in q.gold_facts) or "before it became" in q.question


def _episodes(doc: str) -> list[list[str]]:
    """Split a stand-in document into episodes: each ends with its Question/Fact/Facts line."""
    out, cur = [], []
    for line in doc.split("\n"):
        cur.append(line)
        if line.startswith(("Question: ", "Fact: ", "Facts: ")):
            out.append(cur)
            cur = []
    assert not cur, f"dangling lines {cur}"
    return out


def test_pretraining_documents_are_consistent_copy_episodes():
    # the demo's pretraining stand-in: every answer and restated fact copies what its episode said

    import pytest

    def stated(text: str) -> list[str]:
        return [v for sl in SLOTS for v in sl.values if re.search(rf"\b{v}\b", text)]

    mix = (0.25, 0.25, 0.25, 0.25)  # the default ships "talk" off (its docstring says why); check all four
    docs = pretraining_documents(200, seed=3, mix=mix)
    assert docs == pretraining_documents(200, seed=3, mix=mix) and docs != pretraining_documents(
        200, 4, mix=mix
    )
    assert not any("\nFacts: " in d or d.startswith("Facts: ") for d in pretraining_documents(50, seed=3))
    asks = {re.escape(s.ask).replace(re.escape("{p}"), ".+") + " ": s for s in SLOTS}
    small_talk = [re.escape(c[0]).replace(re.escape("{v}"), ".+") for c in CHITCHAT]
    kinds = {"Question": 0, "Fact": 0, "Records": 0, "Talk": 0}
    for doc in docs:
        episodes = _episodes(doc)
        assert len(episodes) == 6
        for ep in episodes:
            head, body = ep[-1].split(": ", 1)
            if ep[0].startswith("Records: "):
                assert len(ep) == 2
                kinds["Records"] += 1
                slot = next(s for pat, s in asks.items() if re.match(pat, body))
                value = body.rsplit(" ", 1)[1]
                assert value in slot.values
                recs = ep[0].removeprefix("Records: ").split("; ")
                assert len(recs) == 3 and sum(bool(re.search(rf"\b{value}\b", r)) for r in recs) == 1
            elif head == "Facts":  # talk: greeting, 1-2 fact lines (+ small talk), reply, the facts
                kinds["Talk"] += 1
                friend, person = ep[0].split(": ", 1)[0], ep[1].split(": ", 1)[0]
                assert friend in FRIENDS and friend != person and ep[-2].startswith(f"{friend}: ")
                said = [line.split(": ", 1)[1] for line in ep[1:-2]]
                assert all(line.startswith(f"{person}: ") for line in ep[1:-2])
                facts = body.split("; ")
                fact_lines = [x for x in said if not any(re.fullmatch(t, x) for t in small_talk)]
                assert len(facts) == len(fact_lines) in (1, 2) and len(said) - len(fact_lines) in (0, 1)
                for fact, line in zip(facts, fact_lines, strict=True):  # in order, small talk skipped
                    assert fact.startswith(person) and stated(fact) == stated(line) and len(stated(fact)) == 1
            else:
                assert len(ep) == 2
                person, said = ep[0].split(": ", 1)
                kinds[head] += 1
                if head == "Question":
                    assert person in body
                    value = body.rsplit(" ", 1)[1]
                    assert re.search(rf"\b{value}\b", said)
                else:
                    assert head == "Fact" and body.startswith(person)
                    assert len(stated(body)) == 1 and stated(body) == stated(said)
    assert min(kinds.values()) > 150  # all four kinds are well represented (1,200 episodes)
    only_talk = pretraining_documents(5, seed=0, mix=(0, 0, 0, 1))
    assert all(ep[-1].startswith("Facts: ") for d in only_talk for ep in _episodes(d))
    with pytest.raises(ValueError):
        pretraining_documents(1, seed=0, episodes_per_document=0)
    with pytest.raises(ValueError, match="mix"):
        pretraining_documents(1, seed=0, mix=(0.5, 0.5, 0.5))


def test_person_names_recur_when_not_unique():
    # the demo's training data: names recur across sequences, so values cannot be learnt per name
    def people(unique: bool) -> list[str]:
        d = generate(SyntheticConfig(num_sequences=26, num_chunks_per_sequence=1, unique_person_names=unique))
        return [c.turns[1].speaker for c in d.chunks]

    uniq, shared = people(True), people(False)
    assert len(set(uniq)) == 26 and uniq[12] == "Alice 1" and uniq[25] == "Bruno 2"
    assert len(set(shared)) == 12 and shared[0] == shared[12] == shared[24] == "Alice"
