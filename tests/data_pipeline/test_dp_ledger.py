"""The ledger world (data_pipeline/ledger.py): what its records, gold banks and questions promise."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

import pytest

from data_pipeline import ledger
from data_pipeline.ledger_oracle import Flaws, LedgerOracle
from data_pipeline.schema import NO_SUCH_RECORD, ProbeKind
from data_pipeline.synthetic import SyntheticConfig, generate


def _cfg(**kw) -> SyntheticConfig:
    base = dict(
        num_sequences=24,
        num_chunks_per_sequence=6,
        num_chunks_per_window=3,
        world="ledger",
        update_prob=0.6,
        chitchat_prob=0.5,
        seed=3,
    )
    return SyntheticConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def data():
    return generate(_cfg())


def _by_seq(rows):
    out: dict[str, list] = {}
    for r in rows:
        out.setdefault(r.sequence_id, []).append(r)
    return out


def test_record_grammar_round_trips():
    text = ledger.record_text("city", [("Lisbon", ""), ("Oslo", "2023-01-16"), ("Lisbon", "2023-01-30")])
    assert text == "city: Lisbon, then Oslo (2023-01-16), then Lisbon (2023-01-30)"
    rec = ledger.parse_record(text)
    assert rec.key == "city" and rec.current == "Lisbon"
    assert rec.states == (("Lisbon", ""), ("Oslo", "2023-01-16"), ("Lisbon", "2023-01-30"))
    assert ledger.parse_record("City: Lisbon.").current == "Lisbon"
    # prose and malformed histories are not records
    bad_records = (
        "Alice likes popcorn",
        "city: Lisbon, then Oslo",
        "city: New York",
        "Alice's city: Lisbon",
        "",
    )
    for bad in bad_records:
        assert ledger.parse_record(bad) is None, bad


def test_same_seed_same_bytes_other_seed_other_data():
    a, b = generate(_cfg()), generate(_cfg())
    assert [dataclasses.asdict(x) for x in a.probes] == [dataclasses.asdict(x) for x in b.probes]
    assert [c.turns for c in a.chunks] == [c.turns for c in b.chunks]
    assert [c.turns for c in generate(_cfg(seed=4)).chunks] != [c.turns for c in a.chunks]


def test_the_cases_users_report_as_broken_occur(data):
    """A -> B -> A, restatements, contradictions (an update of a stored key) and small talk all occur."""
    kinds: dict[str, int] = {}
    reverts = 0
    for chunks in _by_seq(data.chunks).values():
        for c in chunks:
            for s in ledger.statements(c):
                kinds[s.kind] = kinds.get(s.kind, 0) + 1
        for rec in map(ledger.parse_record, ledger.gold_records(chunks)):
            v = rec.values
            reverts += any(v[i] == v[i - 2] and v[i] != v[i - 1] for i in range(2, len(v)))
    assert kinds.get("restate", 0) >= 10 and kinds.get("update", 0) >= 10 and kinds.get("transient", 0) >= 10
    assert kinds.get("new", 0) >= 24
    assert reverts >= 2, "no A -> B -> A in 24 sequences"


def test_gold_bank_keeps_every_state_with_its_date(data):
    for chunks in _by_seq(data.chunks).values():
        recs = {r.key: r for r in map(ledger.parse_record, ledger.gold_records(chunks))}
        assert len(recs) == len(ledger.gold_records(chunks)), "one record per key"
        for c in chunks:
            for s in ledger.statements(c):
                if s.kind == "update":
                    rec = recs[s.attr]
                    assert (s.value, c.date) in rec.states


def test_probes_refer_to_what_the_gold_bank_holds(data):
    chunks = _by_seq(data.chunks)
    for p in data.probes:
        bank = {
            r.key: r
            for r in map(ledger.parse_record, ledger.gold_records(chunks[p.sequence_id], p.chunk_index))
        }
        key = p.question.removeprefix("What is ").removesuffix("?").split("'s ")[-1]
        if p.is_trap:
            assert p.reference == NO_SUCH_RECORD and key not in bank
        else:
            assert bank[key].current == p.reference
        if p.kind == ProbeKind.TRANSITION:
            assert len(bank[key].states) >= 2


def test_orm_questions_combine_chunks_and_carry_atomic_gold(data):
    assert data.orm_questions
    for q in data.orm_questions:
        assert [g.answer for g in q.gold_facts] == q.answer.split("; ")
        assert len({g.source_chunk for g in q.gold_facts}) >= 2 or q.question.startswith("How did")


def test_training_values_and_the_measured_unseen_share():
    train = generate(_cfg(ledger=ledger.LedgerConfig(values="train")))
    held = generate(_cfg(seed=99))
    assert ledger.unseen_value_share(train.facts) == 0.0
    share = ledger.unseen_value_share(held.facts)
    assert 0.1 < share < 0.45, share  # 2 of 8 values per attribute are never in training


def test_the_gold_oracle_writes_the_gold_bank_and_the_flawed_one_its_flaws(data):
    """The oracle, replaying the native harness's prompt, turns each chunk into the gold bank; with
    flaws it stores small talk and drops histories at their rates."""

    def run(oracle, chunks):
        bank: dict[int, str] = {}
        for c in chunks:
            lines = "\n".join(f"[{i}] {t}" for i, t in bank.items()) or "(none)"
            convo = "\n".join(f"user: {t.speaker}: {t.text}" for t in c.turns)
            prompt = f"Session {c.index}, date {c.date}.\nExisting memories:\n{lines}\n\nNew conversation:\n{convo}"
            for op in json.loads(oracle(prompt))["ops"]:
                if op["op"] == "ADD":
                    bank[len(bank) + 1] = op["text"]
                elif op["op"] == "UPDATE":
                    bank[op["id"]] = op["text"]
        return list(bank.values())

    seqs = _by_seq(data.chunks)
    for chunks in seqs.values():
        assert run(LedgerOracle(), chunks) == ledger.gold_records(chunks)
    flawed = LedgerOracle(Flaws(store_small_talk=0.5, drop_history=0.5, seed=1))
    for chunks in seqs.values():
        run(flawed, chunks)
    n = flawed.counts
    assert 0.25 < n["flaw_store_small_talk"] / (n["flaw_store_small_talk"] + n["skip_transient"]) < 0.75
    assert 0.25 < n["flaw_drop_history"] / (n["flaw_drop_history"] + n["update"]) < 0.75
    with pytest.raises(ValueError, match="store_small_talk"):
        Flaws(store_small_talk=1.5).validate()


def test_bad_world_and_values_are_refused():
    with pytest.raises(ValueError, match="synthetic.world"):
        generate(_cfg(world="ledgr"))
    with pytest.raises(ValueError, match="synthetic.ledger.values"):
        generate(_cfg(ledger=ledger.LedgerConfig(values="some")))


def test_pretraining_documents_are_deterministic_and_in_the_record_grammar():
    a = ledger.pretraining_documents(5, 1)
    assert a == ledger.pretraining_documents(5, 1) and a != ledger.pretraining_documents(5, 2)
    recs = [ln.removeprefix("Record: ") for d in a for ln in d.splitlines() if ln.startswith("Record: ")]
    assert all(r == "none" or ledger.parse_record(r) is not None for r in recs)


def test_session_episodes_copy_id_old_states_and_date_from_where_the_prompt_puts_them():
    docs = ledger.pretraining_documents(60, 4, mixed_share=0.35, session_share=0.5)
    sessions = [e for d in docs for e in re.split(r"\n(?=Session session_)", d) if e.startswith("Session ")]
    assert len(sessions) > 150
    for e in sessions:
        date = re.match(r"Session session_\d+, date (\d{4}-\d\d-\d\d)\.\n", e).group(1)
        shown = dict(re.findall(r"^\[(\d)\] (.+)$", e, flags=re.M))
        (upd,) = re.findall(r"^UPDATE (\d): (.+)$", e, flags=re.M)
        rid, text = upd
        old, new = ledger.parse_record(shown[rid]), ledger.parse_record(text)
        # the record shown under the id keeps every state; the new one took effect on the session's date
        assert new.key == old.key and new.states[:-1] == old.states and new.states[-1][1] == date
        changed = re.search(r"^user: \w+: (?:Actually,|News:) my (.+) is (\S+) now\.$", e, flags=re.M)
        assert changed.groups() == (new.key, new.states[-1][0]) != (old.key, old.states[-1][0])
    # session_share=0 draws nothing more: the corpus every earlier demo pretrained on (digest taken from
    # the generator before session episodes existed; a change to it changes every demo number)
    default = "\n\n".join(ledger.pretraining_documents(40, 0, mixed_share=0.35))
    assert hashlib.sha256(default.encode()).hexdigest().startswith("5c6bae05fff92d91")
    assert not any("Session session_" in d for d in ledger.pretraining_documents(40, 0, mixed_share=0.35))
    with pytest.raises(ValueError, match="session_share=1.5"):
        ledger.pretraining_documents(1, 0, session_share=1.5)
