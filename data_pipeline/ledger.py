"""The ledger world: synthetic streams in which what the writer stores decides the score.

One person per sequence, one session per chunk. In each session the person states durable facts
about themselves ("My city is Lisbon."), restates some of them ("Like I said, my city is Lisbon."),
changes some ("Actually, my city is Oslo now.", sometimes back to an earlier value: A -> B -> A) and
makes small talk about transient things ("My snack today is popcorn."): the traps.

A gold bank holds one record per attribute, in the record grammar below (a bank holds one person's
records, so a key is the attribute alone, as Mem0's memories about "the user" carry no name). An update
keeps every state with the date it took effect (the report's Transition keeps both states), so a
question about the history ("How did Alice's city change?") is answerable from the gold bank, and
so is every other probe and ORM question: `tests/data/test_ledger.py` proves it with the
extractive reader (`reward.instrument`).

Record grammar (one line per key; the writer produces it, the reader and the bank metrics parse it):

    city: Lisbon                                           one state
    city: Lisbon, then Oslo (2023-01-16)                   a change on 2023-01-16: both states kept
    city: Lisbon, then Oslo (2023-01-16), then Lisbon (2023-01-30)

The questions name the person ("What is Alice's city?", "How did Alice's city change?").
Values are single words; attributes are one or two lowercase words. Held-out data draws from every
value of an attribute, training data (`values: train`) only from the first `NUM_TRAIN_VALUES`, so a
held-out set holds a measured mix of seen and unseen values (`unseen_value_share`).
Deterministic: the same (seed, config) always gives byte-identical records.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from dataclasses import dataclass

from data_pipeline.chunking import ChunkingConfig, build_windows, chunk_sequence
from data_pipeline.schema import (
    NO_SUCH_RECORD,
    EvalItem,
    Fact,
    GoldFact,
    OrmQuestion,
    Probe,
    ProbeKind,
    Sequence,
    Session,
    Turn,
    fact_id,
    probe_id,
    question_id,
)

PEOPLE = ("Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Gus", "Hana", "Ivan", "Julia", "Kofi", "Lena")
FRIENDS = ("Sam", "Robin", "Alex", "Jo")
NUM_TRAIN_VALUES = 6  # values [0, 6) of each attribute appear in training data; the rest only held out


@dataclass(frozen=True)
class Attr:
    """A durable attribute of a person (or, in TRANSIENT, a passing one that must not be stored)."""

    name: str  # as it appears in the record key and the questions ("city")
    kind: ProbeKind  # probe kind when first stated
    values: tuple[str, ...]  # one word each; the first NUM_TRAIN_VALUES are the training values
    updatable: bool = False  # may change later in the stream (Transition)


ATTRS = (
    Attr(
        "dog", ProbeKind.PLAIN_RECALL, ("Rex", "Biscuit", "Luna", "Pepper", "Milo", "Nala", "Ziggy", "Olive")
    ),
    Attr(
        "city",
        ProbeKind.PLAIN_RECALL,
        ("Lisbon", "Oslo", "Denver", "Kyoto", "Porto", "Quito", "Tunis", "Hanoi"),
        True,
    ),
    Attr(
        "job",
        ProbeKind.SPECIFICITY,
        ("nurse", "baker", "pilot", "architect", "plumber", "chemist", "tailor", "lawyer"),
        True,
    ),
    Attr("sister", ProbeKind.MINOR_DIMENSION, ("Mia", "Zoe", "Ines", "Tara", "Noor", "Ada", "Lea", "Kim")),
    Attr(
        "car",
        ProbeKind.SPECIFICITY,
        ("red", "green", "silver", "yellow", "blue", "black", "orange", "white"),
        True,
    ),
    Attr(
        "allergy",
        ProbeKind.SEMANTIC_PRECISION,
        ("peanuts", "shellfish", "pollen", "penicillin", "cats", "dust", "soy", "eggs"),
    ),
    Attr(
        "sport",
        ProbeKind.PLAIN_RECALL,
        ("tennis", "rugby", "chess", "volleyball", "squash", "judo", "golf", "rowing"),
        True,
    ),
    Attr(
        "birthday",
        ProbeKind.PLAIN_RECALL,
        ("March", "July", "October", "January", "May", "June", "April", "August"),
    ),
    Attr(
        "instrument",
        ProbeKind.MINOR_DIMENSION,
        ("cello", "banjo", "flute", "trumpet", "harp", "drums", "oboe", "piano"),
        True,
    ),
)
# passing states: stated like a fact ("My snack today is popcorn."), worth no memory
TRANSIENT = (
    Attr(
        "snack", ProbeKind.SHOULD_NOT_STORE, ("popcorn", "grapes", "bagels", "donuts", "crackers", "nachos")
    ),
    Attr("mood", ProbeKind.SHOULD_NOT_STORE, ("sleepy", "grumpy", "cheerful", "restless", "bored", "giddy")),
    Attr(
        "outfit",
        ProbeKind.SHOULD_NOT_STORE,
        ("pyjamas", "overalls", "sneakers", "sandals", "hoodie", "scarf"),
    ),
    Attr("weather", ProbeKind.SHOULD_NOT_STORE, ("rainy", "windy", "foggy", "sunny", "snowy", "humid")),
)
ATTR_BY_NAME = {a.name: a for a in ATTRS + TRANSIENT}

# what the person says (the writer's evidence); {a} attribute, {v} value
SAY_NEW = ("My {a} is {v}.", "Oh, and my {a} is {v}.", "By the way, my {a} is {v}.")
SAY_RESTATE = ("Like I said, my {a} is {v}.", "Again, my {a} is {v}.")
SAY_UPDATE = ("Actually, my {a} is {v} now.", "News: my {a} is {v} now.")
SAY_TRANSIENT = ("My {a} today is {v}.", "Right now my {a} is {v}.")
GREETINGS = ("Hey {p}, how was your week?", "Hi {p}! What's new?", "Good to see you, {p}.", "Morning {p}!")
REPLIES = ("Nice!", "Oh wow.", "Ha, good to know.", "Cool, tell me more.", "Got it.")


# ------------------------------------------------------------------------------------ record grammar
@dataclass(frozen=True)
class LedgerRecord:
    """One parsed record: its key (the attribute, "city") and its states, oldest first, with the date each
    took effect ("" for the first state, whose date the grammar does not carry)."""

    key: str
    states: tuple[tuple[str, str], ...]

    @property
    def current(self) -> str:
        return self.states[-1][0]

    @property
    def values(self) -> list[str]:
        return [v for v, _ in self.states]


_RECORD_RE = re.compile(r"^\s*(?P<key>[A-Za-z]+(?: [A-Za-z]+)?)\s*:\s*(?P<states>.+?)\s*\.?\s*$")
_LATER_RE = re.compile(r"^(?P<v>\S+) \((?P<d>\d{4}-\d{2}-\d{2})\)$")


def question_key(person: str, attr: str) -> str:
    """How a question names a record: "Alice's city"."""
    return f"{person}'s {attr}"


def record_text(attr: str, states: list[tuple[str, str]]) -> str:
    """The gold record of an attribute: states oldest first, each later one with the date it took effect."""
    if not states:
        raise ValueError("record_text: a record holds at least one state")
    parts = [states[0][0]] + [f"{v} ({d})" for v, d in states[1:]]
    return f"{attr}: " + ", then ".join(parts)


def parse_record(text: str) -> LedgerRecord | None:
    """A record in the grammar above, or None for any other text (small talk a writer stored in prose,
    a malformed record). Lenient about case and a trailing full stop; strict about the shape."""
    m = _RECORD_RE.match(text)
    if not m:
        return None
    parts = m.group("states").split(", then ")
    first = parts[0].strip()
    if not first or " " in first:
        return None
    states = [(first, "")]
    for p in parts[1:]:
        later = _LATER_RE.match(p.strip())
        if later is None:
            return None
        states.append((later.group("v"), later.group("d")))
    return LedgerRecord(m.group("key").strip(), tuple(states))


def normalise_key(key: str) -> str:
    return " ".join(key.casefold().split())


# ------------------------------------------------------------------------------------------- world
@dataclass
class LedgerConfig:
    """The ledger world's own knobs (SyntheticConfig carries them when world=ledger)."""

    restate_prob: float = 0.35  # chance a chunk (from the 2nd on) restates a stored fact unchanged
    revert_prob: float = 0.4  # chance an update goes back to the value before the current one (A -> B -> A)
    values: str = "all"  # "train": only the first NUM_TRAIN_VALUES values of each attribute; "all"

    def validate(self) -> None:
        if self.values not in ("train", "all"):
            raise ValueError(f"synthetic.ledger.values={self.values!r}: want 'train' or 'all'")
        for name in ("restate_prob", "revert_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"synthetic.ledger.{name}={getattr(self, name)}: want a probability")


@dataclass
class _State:
    value: str
    date: str
    chunk: int
    fact: Fact


@dataclass(frozen=True)
class Statement:
    """One person turn of a chunk and what it means for the bank (the oracle and the metrics read it)."""

    turn_id: str
    kind: str  # "new" | "restate" | "update" | "transient"
    attr: str
    value: str


def pool(attr: Attr, values: str) -> tuple[str, ...]:
    return attr.values[:NUM_TRAIN_VALUES] if values == "train" else attr.values


def parse_statement(text: str) -> tuple[str, str, str] | None:
    """(kind, attribute, value) of a person's line in this world, or None (greetings, replies)."""
    for kind, forms in (
        ("restate", SAY_RESTATE),
        ("update", SAY_UPDATE),
        ("transient", SAY_TRANSIENT),
        ("new", SAY_NEW),
    ):
        for f in forms:
            pat = (
                "^" + re.escape(f).replace(r"\{a\}", "(?P<a>[a-z]+)").replace(r"\{v\}", r"(?P<v>\S+?)") + "$"
            )
            m = re.match(pat, text)
            if m and m.group("a") in ATTR_BY_NAME:
                return kind, m.group("a"), m.group("v")
    return None


def generate_ledger_sequence(cfg, n: int) -> dict[str, list]:
    """One sequence of the ledger world as tables (name -> rows, as `SyntheticData.tables()`);
    cfg: data_pipeline.synthetic.SyntheticConfig."""
    lc: LedgerConfig = cfg.ledger
    rng = random.Random(f"hymem-ledger:{cfg.seed}:{n}")
    suffix = n >= len(PEOPLE) and cfg.unique_person_names
    person = PEOPLE[n % len(PEOPLE)] + (f" {n // len(PEOPLE)}" if suffix else "")
    friend = FRIENDS[n % len(FRIENDS)]
    seq_id = f"synth/{cfg.seed}/{n:04d}"
    start = dt.date.fromisoformat(cfg.start_date)
    history: dict[str, list[_State]] = {}  # attribute -> its states so far
    free = list(ATTRS)
    rng.shuffle(free)
    sessions: list[Session] = []
    facts: list[Fact] = []
    probes: list[Probe] = []
    for t in range(cfg.num_chunks_per_sequence):
        date = (start + dt.timedelta(days=7 * t)).isoformat()
        turns = [Turn(f"D{t + 1}:1", friend, rng.choice(GREETINGS).format(p=person))]
        lines: list[tuple[str, str, str]] = []  # (kind, attribute, value) of the person's lines
        stated = sorted(history)
        if t >= 1 and stated and rng.random() < lc.restate_prob:
            a = rng.choice(stated)
            lines.append(("restate", a, history[a][-1].value))
        changeable = [a for a in stated if ATTR_BY_NAME[a].updatable and all(x[1] != a for x in lines)]
        num_new = 1 + (rng.random() < cfg.second_fact_prob)
        if t >= 1 and changeable and rng.random() < cfg.update_prob:
            a = rng.choice(changeable)
            seen = [s.value for s in history[a]]
            if len(seen) >= 2 and seen[-2] != seen[-1] and rng.random() < lc.revert_prob:
                v = seen[-2]  # A -> B -> A
            else:
                v = rng.choice(
                    [x for x in pool(ATTR_BY_NAME[a], lc.values) if x not in seen]
                    or [x for x in pool(ATTR_BY_NAME[a], lc.values) if x != seen[-1]]
                )
            lines.append(("update", a, v))
            num_new -= 1
        for _ in range(num_new):
            if free:
                attr = free.pop()
                lines.append(("new", attr.name, rng.choice(pool(attr, lc.values))))
        if rng.random() < cfg.chitchat_prob:
            tr = rng.choice(TRANSIENT)
            lines.insert(rng.randrange(len(lines) + 1), ("transient", tr.name, rng.choice(tr.values)))
        k_probe = 0
        for kind, a, v in lines:
            form = {"new": SAY_NEW, "restate": SAY_RESTATE, "update": SAY_UPDATE, "transient": SAY_TRANSIENT}[
                kind
            ]
            tid = f"D{t + 1}:{len(turns) + 1}"
            turns.append(Turn(tid, person, rng.choice(form).format(a=a, v=v)))
            q = f"What is {question_key(person, a)}?"
            if kind == "transient":
                rubric = (
                    f"{person} only mentioned a passing {a}; no lasting {a} was ever stated. Full credit "
                    "only if the answer says there is no such record; 0 if it names anything."
                )
                probes.append(
                    Probe(
                        probe_id(seq_id, t, k_probe),
                        seq_id,
                        t,
                        ProbeKind.SHOULD_NOT_STORE,
                        q,
                        NO_SUCH_RECORD,
                        rubric,
                        True,
                        [],
                    )
                )
                k_probe += 1
                continue
            if kind == "restate":  # no new fact: the stored one must still answer, and be stored once
                fid = history[a][-1].fact.fact_id
                rubric = f"Full credit only for the {a} '{v}'; 0 for another {a}, a hedge, or no record."
                probes.append(
                    Probe(
                        probe_id(seq_id, t, k_probe),
                        seq_id,
                        t,
                        ProbeKind.PLAIN_RECALL,
                        q,
                        v,
                        rubric,
                        False,
                        [fid],
                    )
                )
                k_probe += 1
                continue
            prev = history[a][-1].fact.fact_id if kind == "update" else ""
            f = Fact(
                fact_id(seq_id, t, sum(x.chunk_index == t for x in facts)),
                seq_id,
                t,
                record_text(a, [(v, "")]),
                [tid],
                prev,
            )
            facts.append(f)
            history.setdefault(a, []).append(_State(v, date, t, f))
            if kind == "update":
                old = history[a][-2].value
                rubric = (
                    f"The {a} changed from '{old}' to '{v}'. Full credit only for the current {a} '{v}'; "
                    f"0 for '{old}' alone or for a hedge between them."
                )
                pk = ProbeKind.TRANSITION
            else:
                rubric = f"Full credit only for the {a} '{v}'; 0 for another {a}, a hedge, or no record."
                pk = ATTR_BY_NAME[a].kind
            probes.append(
                Probe(probe_id(seq_id, t, k_probe), seq_id, t, pk, q, v, rubric, False, [f.fact_id])
            )
            k_probe += 1
        turns.append(Turn(f"D{t + 1}:{len(turns) + 1}", friend, rng.choice(REPLIES)))
        sessions.append(Session(f"session_{t + 1}", date, turns))

    seq = Sequence(seq_id, "synthetic_ledger", sessions, speakers=[person, friend])
    chunks = chunk_sequence(
        seq, ChunkingConfig(mode="session", num_chunks_per_window=cfg.num_chunks_per_window)
    )
    windows = build_windows(chunks, cfg.num_chunks_per_window)
    return {
        "sequences": [seq],
        "chunks": chunks,
        "windows": windows,
        "facts": facts,
        "probes": probes,
        "orm_questions": _orm_questions(cfg, rng, seq_id, person, windows, history),
        "eval_items": _eval_items(seq_id, person, history, probes),
    }


def _history_answer(states: list[_State]) -> str:
    return "; ".join(s.value for s in states)


def _orm_questions(cfg, rng, seq_id, person, windows, history) -> list[OrmQuestion]:
    """Per window: the history of a key that changed inside it (every state a gold fact, credited to
    the chunk that stated it), and pairs of current values stated in different chunks. Every question
    is asked after its window, about the bank as the window leaves it."""
    out = []
    for w in windows:
        last = w.chunk_indices[-1]
        asof = {a: [s for s in st if s.chunk <= last] for a, st in history.items()}
        asof = {a: st for a, st in asof.items() if st}
        cands: list[tuple[str, str, list[_State], str]] = []
        for a, st in sorted(asof.items()):
            if len(st) >= 2 and st[-1].chunk in w.chunk_indices:
                q = f"How did {question_key(person, a)} change?"
                ans = _history_answer(st)
                rubric = (
                    f"The {a} went {' -> '.join(s.value for s in st)}. Credit each state recovered, "
                    "in order; the current state alone recovers only the last one."
                )
                cands.append((q, ans, st, rubric))
        current = sorted(((a, st[-1]) for a, st in asof.items()), key=lambda x: x[1].chunk)
        in_w = [(a, s) for a, s in current if s.chunk in w.chunk_indices]
        for a, s in in_w:
            others = [(b, o) for b, o in current if o.chunk != s.chunk and b != a]
            if not others:
                continue
            b, o = rng.choice(others)
            (a1, s1), (a2, s2) = sorted([(a, s), (b, o)], key=lambda x: (x[1].chunk, x[0]))
            q = f"What are {question_key(person, a1)} and {a2}?"
            rubric = f"Two facts: the {a1} '{s1.value}' and the {a2} '{s2.value}'. Credit each one recovered."
            cands.append((q, f"{s1.value}; {s2.value}", [s1, s2], rubric))
        rng.shuffle(cands)
        seen_q: set[str] = set()
        k = 0
        for q, ans, gold, rubric in cands:
            if q in seen_q or k >= cfg.num_orm_questions_per_window:
                continue
            seen_q.add(q)
            out.append(
                OrmQuestion(
                    question_id(seq_id, w.index, k),
                    seq_id,
                    w.index,
                    q,
                    ans,
                    sorted({g.chunk for g in gold}),
                    [GoldFact(g.fact.text, g.chunk, g.fact.fact_id, g.value) for g in gold],
                    rubric,
                )
            )
            k += 1
    return out


def _eval_items(
    seq_id: str, person: str, history: dict[str, list[_State]], probes: list[Probe]
) -> list[EvalItem]:
    """End-of-stream QA (the swap table): every key's current value, every changed key's history,
    and the traps."""
    items: list[EvalItem] = []

    def add(question: str, answer: str, category: str, states: list[_State], trap: bool = False) -> None:
        items.append(
            EvalItem(
                f"{seq_id}/q{len(items):03d}",
                "synthetic",
                seq_id,
                question,
                answer,
                category,
                [tid for s in states for tid in s.fact.turn_ids],
                evidence_chunks=sorted({s.chunk for s in states}),
                is_trap=trap,
            )
        )

    for a, st in sorted(history.items()):
        add(
            f"What is {question_key(person, a)}?",
            st[-1].value,
            "transition" if len(st) > 1 else ATTR_BY_NAME[a].kind.value,
            st[-1:],
        )
        if len(st) > 1:
            add(f"How did {question_key(person, a)} change?", _history_answer(st), "history", st)
    for q in sorted({p.question for p in probes if p.is_trap}):
        add(q, NO_SUCH_RECORD, ProbeKind.SHOULD_NOT_STORE.value, [], trap=True)
    return items


# -------------------------------------------------------------------------------- gold banks (tests,
# reader self-checks, the bound rows, the bank metrics)
def statements(chunk) -> list[Statement]:
    """The person lines of a ledger chunk, parsed (a data_pipeline.schema.Chunk)."""
    out = []
    for turn in chunk.turns:
        p = parse_statement(turn.text)
        if p is not None:
            out.append(Statement(turn.turn_id, *p))
    return out


def gold_records(chunks, upto: int | None = None) -> list[str]:
    """The gold bank of one sequence after chunk `upto` (default: the last), from its chunks alone:
    one record per key, every state kept with the date it took effect; restatements and transient
    lines change nothing."""
    states: dict[str, list[tuple[str, str]]] = {}
    for c in sorted(chunks, key=lambda c: c.index):
        if upto is not None and c.index > upto:
            break
        for turn in c.turns:
            p = parse_statement(turn.text)
            if p is None:
                continue
            kind, a, v = p
            if kind == "new":
                states[a] = [(v, "")]
            elif kind == "update":
                states.setdefault(a, []).append((v, c.date))
    return [record_text(a, st) for a, st in states.items()]


def transient_records(chunks, upto: int | None = None) -> list[str]:
    """What a writer that stores small talk adds: one record per transient line (the polluted bank)."""
    out = []
    for c in sorted(chunks, key=lambda c: c.index):
        if upto is not None and c.index > upto:
            break
        for turn in c.turns:
            p = parse_statement(turn.text)
            if p is not None and p[0] == "transient":
                out.append(record_text(p[1], [(p[2], "")]))
    return out


def unseen_value_share(facts) -> float:
    """Share of gold fact values outside the training pool (values [NUM_TRAIN_VALUES:])."""
    vals = []
    for f in facts:
        r = parse_record(f.text)
        if r is not None:
            attr = ATTR_BY_NAME.get(r.key)
            if attr is not None:
                vals.append(r.current not in attr.values[:NUM_TRAIN_VALUES])
    return sum(vals) / len(vals) if vals else 0.0


def pretraining_documents(
    num_documents: int,
    seed: int,
    episodes_per_document: int = 8,
    mixed_share: float = 0.0,
    session_share: float = 0.0,
) -> list[str]:
    """Plain-text copy episodes in the ledger's own forms: the tiny demo models' stand-in for the
    pretraining of the report's LLMs (a writer must copy an attribute and a value from a line
    into a record, and append a state to a record). Each episode draws a person, attributes and values
    at random from every value (no person-value pairing to memorise):
    - fact:      "Alice: My city is Lisbon.\\nRecord: city: Lisbon"
    - change:    "Record: city: Lisbon\\n2023-01-16 Alice: Actually, my city is Oslo now.\\n"
                 "Record: city: Lisbon, then Oslo (2023-01-16)"
    - skip:      "Alice: My snack today is popcorn.\\nRecord: none" (transient lines and restatements)
    - mixed (`mixed_share` of the episodes): 2-4 lines of new facts, restatements and small talk in any
                 order, then "Records: job: pilot; dog: Rex" (the new facts only) or "Records: none"
    - session (`session_share`, drawn before `mixed_share`): the native writer prompt's layout, a
                 session header with its date, numbered existing records and a conversation, then one
                 line per operation: "UPDATE 2: sport: golf, then chess (2023-01-16)", and "ADD: dog: Rex"
                 when a new fact is stated too (`_session_episode`). Here the old state, the record's id and the date sit
                 where the writer's prompt puts them, away from the line that changes them.
    Not the harness's JSON or chat template: SFT teaches those. Deterministic in its arguments; with
    `session_share=0` the documents are the ones drawn before that kind existed."""
    if num_documents < 0 or episodes_per_document < 1:
        raise ValueError("num_documents must be >= 0 and episodes_per_document >= 1")
    if not (0.0 <= mixed_share <= 1.0 and 0.0 <= session_share <= 1.0):
        raise ValueError(f"mixed_share={mixed_share}, session_share={session_share}: want shares in [0, 1]")
    rng = random.Random(f"hymem-ledger-pretrain:{seed}")
    people = PEOPLE + FRIENDS
    start = dt.date(2023, 1, 2)
    docs = []
    for _ in range(num_documents):
        eps = []
        for _ in range(episodes_per_document):
            p, r = rng.choice(people), rng.random()
            a = rng.choice(ATTRS)
            v = rng.choice(a.values)
            # drawn only when asked for, so session_share=0 keeps every earlier corpus as it was
            if session_share and rng.random() < session_share:
                eps.append(_session_episode(rng, p, start))
            elif rng.random() < mixed_share:
                eps.append(_mixed_episode(rng, p))
            elif r < 0.5:
                eps.append(
                    f"{p}: {rng.choice(SAY_NEW).format(a=a.name, v=v)}\nRecord: {record_text(a.name, [(v, '')])}"
                )
            elif r < 0.8:
                states = [(v, "")]
                for _ in range(rng.choice((0, 0, 1))):
                    states.append(
                        (rng.choice(a.values), (start + dt.timedelta(days=7 * rng.randrange(20))).isoformat())
                    )
                new = rng.choice([x for x in a.values if x != states[-1][0]])
                d = (start + dt.timedelta(days=7 * rng.randrange(20, 40))).isoformat()
                eps.append(
                    f"Record: {record_text(a.name, states)}\n{d} {p}: "
                    f"{rng.choice(SAY_UPDATE).format(a=a.name, v=new)}\n"
                    f"Record: {record_text(a.name, [*states, (new, d)])}"
                )
            else:
                if rng.random() < 0.5:
                    tr = rng.choice(TRANSIENT)
                    line = rng.choice(SAY_TRANSIENT).format(a=tr.name, v=rng.choice(tr.values))
                else:
                    line = rng.choice(SAY_RESTATE).format(a=a.name, v=v)
                eps.append(f"{p}: {line}\nRecord: none")
        docs.append("\n".join(eps))
    return docs


def _session_episode(rng: random.Random, p: str, start: dt.date) -> str:
    """A copy episode laid out as the native writer's prompt (its header, "Existing memories:" with
    record ids, "New conversation:" with "user: " lines). One to three records are shown, each with an
    earlier change at a rate of 0.3; the person changes one of them, may state a new fact and make small
    talk; the answer is one line per operation, the change keeping every state with the session's date."""
    day = rng.randrange(6, 60)
    date = (start + dt.timedelta(days=7 * day)).isoformat()
    shown = []
    for a, rid in zip(rng.sample(ATTRS, rng.randint(1, 3)), rng.sample(range(1, 10), 3), strict=False):
        states = [(rng.choice(a.values), "")]
        if rng.random() < 0.3:
            states.append(
                (
                    rng.choice([x for x in a.values if x != states[0][0]]),
                    (start + dt.timedelta(days=7 * rng.randrange(day))).isoformat(),
                )
            )
        shown.append((rid, a, states))
    rid, a, states = rng.choice(shown)
    new = rng.choice([x for x in a.values if x != states[-1][0]])
    lines = [f"{p}: {rng.choice(SAY_UPDATE).format(a=a.name, v=new)}"]
    ops = [f"UPDATE {rid}: {record_text(a.name, [*states, (new, date)])}"]
    if rng.random() < 0.4:
        b = rng.choice([x for x in ATTRS if x not in {s[1] for s in shown}])
        w = rng.choice(b.values)
        at = rng.randrange(len(lines) + 1)
        lines.insert(at, f"{p}: {rng.choice(SAY_NEW).format(a=b.name, v=w)}")
        ops.insert(at, f"ADD: {record_text(b.name, [(w, '')])}")
    if rng.random() < 0.5:
        tr = rng.choice(TRANSIENT)
        lines.insert(
            rng.randrange(len(lines) + 1),
            f"{p}: {rng.choice(SAY_TRANSIENT).format(a=tr.name, v=rng.choice(tr.values))}",
        )
    friend = rng.choice(FRIENDS)
    convo = [f"{friend}: {rng.choice(GREETINGS).format(p=p)}", *lines, f"{friend}: {rng.choice(REPLIES)}"]
    memories = "\n".join(f"[{i}] {record_text(b.name, st)}" for i, b, st in shown)
    return (
        f"Session session_{day}, date {date}.\nExisting memories:\n{memories}\n\nNew conversation:\n"
        + "\n".join(f"user: {ln}" for ln in convo)
        + "\n"
        + "\n".join(ops)
    )


def _mixed_episode(rng: random.Random, p: str) -> str:
    lines, recs = [], []
    for a in rng.sample(ATTRS, rng.randint(1, 3)):
        v = rng.choice(a.values)
        if rng.random() < 0.6:
            lines.append(rng.choice(SAY_NEW).format(a=a.name, v=v))
            recs.append(record_text(a.name, [(v, "")]))
        else:
            lines.append(rng.choice(SAY_RESTATE).format(a=a.name, v=v))
    if rng.random() < 0.6:
        tr = rng.choice(TRANSIENT)
        lines.insert(
            rng.randrange(len(lines) + 1),
            rng.choice(SAY_TRANSIENT).format(a=tr.name, v=rng.choice(tr.values)),
        )
    body = "\n".join(f"{p}: {ln}" for ln in lines)
    return f"{body}\nRecords: {'; '.join(recs) or 'none'}"
