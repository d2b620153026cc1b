"""Synthetic long-interaction streams with gold annotations known by construction.

The CPU demo trains a tiny writer on this data, so it needs no annotator LLM: every chunk is one
short session (a few short turns, < 60 words) in which one person states atomic facts about
themselves ("My dog Rex ..." -> fact "Alice's dog is named Rex", probe "What is the name of Alice's
dog?" reference "Rex"), sometimes updates an earlier fact (old state replaced by the new one:
Transition probe; the new Fact `supersedes` the old) and sometimes makes small talk about something
transient (a Should-not-store trap, reference "no such record"). ORM questions combine facts of
different chunks; each gold fact carries its source chunk and its atomic answer span. All answers
are single spans, so built datasets declare `answers_atomic=True` (the reward's exact-match scorer
may be used on them).

Three episode kinds, mixed over the sequences by `SyntheticConfig.mix` (default: chat alone, so the
demo's data is byte-identical to the generator before the other kinds existed):
- chat: the conversations above (the report's Chat / Mem0 / MemOS scenes);
- working: a user asks an agent to do things in a project; the agent's tool calls return results that
  carry the facts (a deployment's host, a ticket id, a config port), some later changed by another tool
  call (Transition); transient tool output (a CPU reading, the time) is the trap (the Working scene);
- coding: a user asks for edits in a repository; the agent's unified diffs carry the facts (a renamed
  function, a changed constant, a version pin), a later diff changing them again; transient command
  output (a test run, `git status`) is the trap (the Coding scene).

Deterministic: the same (seed, config) always gives byte-identical records.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field

from data_pipeline.chunking import ChunkingConfig, build_windows, chunk_sequence
from data_pipeline.ledger import LedgerConfig, generate_ledger_sequence
from data_pipeline.schema import (
    NO_SUCH_RECORD,
    Chunk,
    EvalItem,
    Fact,
    GoldFact,
    OrmQuestion,
    Probe,
    ProbeKind,
    Sequence,
    Session,
    Turn,
    Window,
    fact_id,
    probe_id,
    question_id,
)

WORLDS = ("templated", "ledger")
PEOPLE = ["Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Gus", "Hana", "Ivan", "Julia", "Kofi", "Lena"]
FRIENDS = ["Sam", "Robin", "Alex", "Jo"]


@dataclass(frozen=True)
class Slot:
    """One attribute of a person: how it is said, stored, asked and (maybe) updated."""

    name: str
    kind: ProbeKind  # probe kind when the value is first stated
    values: tuple[str, ...]
    say: str  # turn text stating the value ({v})
    fact: str  # atomic fact ({p} person, {v} value)
    ask: str  # probe question ({p})
    noun: str  # what a wrong answer would name, for the rubric
    update_say: str = ""  # turn text replacing the value; "" = never updated
    update_fact: str = ""  # fact text of the update


SLOTS = (
    Slot(
        "dog",
        ProbeKind.PLAIN_RECALL,
        ("Rex", "Biscuit", "Luna", "Pepper", "Milo"),
        "My dog {v} chewed my shoes again.",
        "{p}'s dog is named {v}",
        "What is the name of {p}'s dog?",
        "dog name",
    ),
    Slot(
        "city",
        ProbeKind.PLAIN_RECALL,
        ("Lisbon", "Oslo", "Denver", "Kyoto", "Porto", "Quito"),
        "I live in {v}, near the river.",
        "{p} lives in {v}",
        "Which city does {p} live in?",
        "city",
        "Big news: I just moved to {v}!",
        "{p} moved to {v} and lives there now",
    ),
    Slot(
        "job",
        ProbeKind.SPECIFICITY,
        ("nurse", "baker", "pilot", "architect", "plumber", "chemist"),
        "I work as a {v} these days.",
        "{p} works as a {v}",
        "What is {p}'s job?",
        "job",
        "I quit my old job, now I work as a {v}.",
        "{p} changed jobs and now works as a {v}",
    ),
    Slot(
        "sister",
        ProbeKind.MINOR_DIMENSION,
        ("Mia", "Zoe", "Ines", "Tara", "Noor"),
        "My sister {v} says hi, by the way.",
        "{p}'s sister is named {v}",
        "What is the name of {p}'s sister?",
        "sister's name",
    ),
    Slot(
        "car",
        ProbeKind.SPECIFICITY,
        ("red", "green", "silver", "yellow", "blue"),
        "I finally bought a {v} car.",
        "{p} owns a {v} car",
        "What color is {p}'s car?",
        "color",
        "I had my car repainted {v}.",
        "{p}'s car is now {v}",
    ),
    Slot(
        "allergy",
        ProbeKind.SEMANTIC_PRECISION,
        ("peanuts", "shellfish", "pollen", "penicillin", "cats"),
        "Careful, I am allergic to {v}.",
        "{p} is allergic to {v}",
        "What is {p} allergic to?",
        "allergen",
    ),
    Slot(
        "sport",
        ProbeKind.PLAIN_RECALL,
        ("tennis", "rugby", "chess", "volleyball", "squash"),
        "I play {v} every Sunday.",
        "{p} plays {v} every Sunday",
        "Which sport does {p} play every Sunday?",
        "sport",
        "I stopped my old sport, I play {v} on Sundays now.",
        "{p} now plays {v} every Sunday",
    ),
    Slot(
        "month",
        ProbeKind.PLAIN_RECALL,
        ("March", "July", "October", "January", "May"),
        "My birthday is in {v}.",
        "{p}'s birthday is in {v}",
        "In which month is {p}'s birthday?",
        "month",
    ),
    Slot(
        "instrument",
        ProbeKind.MINOR_DIMENSION,
        ("cello", "banjo", "flute", "trumpet", "harp"),
        "I am learning the {v} at night.",
        "{p} is learning the {v}",
        "Which instrument is {p} learning?",
        "instrument",
    ),
)

# transient small talk: worth no memory; the trap asks for a lasting preference the bank must not invent
CHITCHAT = (
    (
        "I'm eating {v} right now, so good.",
        ("a bagel", "some grapes", "a donut", "popcorn"),
        "What is {p}'s favorite snack?",
    ),
    (
        "Ugh, it is {v} outside today.",
        ("raining", "so windy", "foggy", "freezing"),
        "What weather does {p} prefer?",
    ),
    (
        "I'm watching {v} on TV, lol.",
        ("a cooking show", "a quiz show", "old cartoons", "the news"),
        "What is {p}'s favorite TV show?",
    ),
)
GREETINGS = ("Hey {p}, how was your week?", "Hi {p}! What's new?", "Good to see you, {p}.", "Morning {p}!")
REPLIES = ("Nice!", "Oh wow.", "Ha, good to know.", "Cool, tell me more.", "Got it.")


@dataclass
class SyntheticConfig:
    num_sequences: int = 4  # sequences (one person each) to generate
    num_chunks_per_sequence: int = 10  # chunks (= sessions) per sequence
    num_chunks_per_window: int = 5  # chunks per RL window (at most 5)
    num_orm_questions_per_window: int = 2  # cross-chunk questions per window (when enough facts exist)
    update_prob: float = 0.3  # chance a chunk (from the 3rd on) updates an earlier fact (Transition)
    chitchat_prob: float = 0.5  # chance a chunk holds transient small talk (Should-not-store trap)
    second_fact_prob: float = 0.3  # chance a chunk states a second new fact
    seed: int = 0  # generator seed; same seed + config -> identical data
    # sequence n >= 12 names its person "<name> <n // 12>" so every sequence has its own person. false:
    # the 12 names recur across sequences (different people, different values), so a model cannot
    # learn a name's values and has to copy them from the chunk (the CPU demo's training data)
    unique_person_names: bool = True
    start_date: str = "2023-01-02"  # date of the first session (ISO)
    # shares of the episode kinds over the sequences: chat | working | coding (see top); {} = chat alone
    # (empty, not {chat: 1}: Hydra merges a given mix into the default's keys). Sequence n's kind is fixed
    # by the shares (largest remainder) and the seed, never by the other kinds' random draws
    mix: dict[str, float] = field(default_factory=dict)
    # "templated": the episode kinds above; "ledger": data_pipeline.ledger (restatements, Transitions
    # that keep every state with its date, A -> B -> A, small talk stated like a fact), mix unused
    world: str = "templated"
    ledger: LedgerConfig = field(default_factory=LedgerConfig)  # the ledger world's knobs


@dataclass
class SyntheticData:
    sequences: list[Sequence] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    orm_questions: list[OrmQuestion] = field(default_factory=list)
    eval_items: list[EvalItem] = field(default_factory=list)

    def tables(self) -> dict[str, list]:
        return {
            "sequences": self.sequences,
            "chunks": self.chunks,
            "windows": self.windows,
            "facts": self.facts,
            "probes": self.probes,
            "orm_questions": self.orm_questions,
            "eval_items": self.eval_items,
        }


@dataclass
class _Stated:
    fact: Fact
    slot: Slot
    value: str
    current: bool = True


def _rubric_exact(noun: str, value: str) -> str:
    return (
        f"Full credit (1) only if the answer gives the {noun} '{value}'. "
        f"0 if it gives another {noun}, hedges between several, or says nothing is recorded."
    )


def _rubric_transition(noun: str, new: str, old: str) -> str:
    return (
        f"The {noun} changed from '{old}' to '{new}'. Full credit only if the answer gives the current "
        f"{noun} '{new}' (mentioning that it used to be '{old}' is fine). 0 if it gives only '{old}'."
    )


def _rubric_trap(p: str) -> str:
    return (
        f"{p} never stated such a lasting preference; only passing small talk exists. Full credit only "
        "if the answer says there is no such record; 0 if it names anything."
    )


def generate_sequence(cfg: SyntheticConfig, n: int) -> SyntheticData:
    rng = random.Random(f"hymem-synth:{cfg.seed}:{n}")
    suffix = n >= len(PEOPLE) and cfg.unique_person_names
    person = PEOPLE[n % len(PEOPLE)] + (f" {n // len(PEOPLE)}" if suffix else "")
    friend = FRIENDS[n % len(FRIENDS)]
    seq_id = f"synth/{cfg.seed}/{n:04d}"
    start = dt.date.fromisoformat(cfg.start_date)
    out = SyntheticData()
    stated: dict[str, _Stated] = {}  # slot name -> current statement
    history: list[_Stated] = []  # every statement, in order (old values kept for Transition ORM)
    free_slots = list(SLOTS)
    rng.shuffle(free_slots)
    sessions: list[Session] = []
    per_chunk: list[dict] = []  # what chunk t introduced: facts, probes (built after chunking)

    for t in range(cfg.num_chunks_per_sequence):
        date = (start + dt.timedelta(days=7 * t)).isoformat()
        turns: list[Turn] = []
        probes: list[tuple[ProbeKind, str, str, str, bool, list[str]]] = []
        facts: list[Fact] = []

        def say(speaker: str, text: str, _t: int = t, _turns: list[Turn] = turns) -> str:
            tid = f"D{_t + 1}:{len(_turns) + 1}"
            _turns.append(Turn(turn_id=tid, speaker=speaker, text=text))
            return tid

        def new_fact(
            text: str, tid: str, supersedes: str = "", _t: int = t, _facts: list[Fact] = facts
        ) -> Fact:
            f = Fact(fact_id(seq_id, _t, len(_facts)), seq_id, _t, text, [tid], supersedes)
            _facts.append(f)
            return f

        say(friend, rng.choice(GREETINGS).format(p=person))
        updatable = [s for s in stated.values() if s.slot.update_say and s.current]
        do_update = t >= 2 and updatable and rng.random() < cfg.update_prob
        num_new = 1 + (rng.random() < cfg.second_fact_prob)
        if do_update:
            old = rng.choice(sorted(updatable, key=lambda s: s.slot.name))
            used = {h.value for h in history if h.slot.name == old.slot.name}
            # a value used before would make "what was it before it became X?" ambiguous
            fresh = [v for v in old.slot.values if v not in used]
            value = rng.choice(fresh or [v for v in old.slot.values if v != old.value])
            tid = say(person, old.slot.update_say.format(v=value))
            f = new_fact(old.slot.update_fact.format(p=person, v=value), tid, supersedes=old.fact.fact_id)
            old.current = False
            st = _Stated(f, old.slot, value)
            stated[old.slot.name] = st
            history.append(st)
            rubric = _rubric_transition(old.slot.noun, value, old.value)
            probes.append(
                (ProbeKind.TRANSITION, old.slot.ask.format(p=person), value, rubric, False, [f.fact_id])
            )
            num_new -= 1
        for _ in range(num_new):
            if not free_slots:
                break
            slot = free_slots.pop()
            value = rng.choice(slot.values)
            tid = say(person, slot.say.format(v=value))
            f = new_fact(slot.fact.format(p=person, v=value), tid)
            st = _Stated(f, slot, value)
            stated[slot.name] = st
            history.append(st)
            q = slot.ask.format(p=person)
            probes.append((slot.kind, q, value, _rubric_exact(slot.noun, value), False, [f.fact_id]))
        if rng.random() < cfg.chitchat_prob:
            line, values, trap_q = rng.choice(CHITCHAT)
            say(person, line.format(v=rng.choice(values)))
            q = trap_q.format(p=person)
            probes.append((ProbeKind.SHOULD_NOT_STORE, q, NO_SUCH_RECORD, _rubric_trap(person), True, []))
        say(friend, rng.choice(REPLIES))
        sessions.append(Session(session_id=f"session_{t + 1}", date=date, turns=turns))
        per_chunk.append({"facts": facts, "probes": probes})

    seq = Sequence(seq_id, "synthetic", sessions, speakers=[person, friend])
    out.sequences.append(seq)
    out.chunks = chunk_sequence(
        seq, ChunkingConfig(mode="session", num_chunks_per_window=cfg.num_chunks_per_window)
    )
    out.windows = build_windows(out.chunks, cfg.num_chunks_per_window)
    for t, pc in enumerate(per_chunk):
        out.facts += pc["facts"]
        for k, (kind, q, ref, rubric, trap, fids) in enumerate(pc["probes"]):
            out.probes.append(Probe(probe_id(seq_id, t, k), seq_id, t, kind, q, ref, rubric, trap, fids))

    out.orm_questions = _orm_questions(cfg, rng, seq_id, person, out.windows, history)
    out.eval_items = _eval_items(seq, person, stated, out.probes)
    return out


def _orm_questions(
    cfg: SyntheticConfig,
    rng: random.Random,
    seq_id: str,
    person: str,
    windows: list[Window],
    history: list[_Stated],
) -> list[OrmQuestion]:
    out = []
    for w in windows:
        last = w.chunk_indices[-1]
        in_window = [s for s in history if s.fact.chunk_index in w.chunk_indices]
        seen = [s for s in history if s.fact.chunk_index <= last]
        # value of each slot at the end of this window (a later update must not leak backwards)
        current_at_end: dict[str, _Stated] = {}
        for s in seen:
            current_at_end[s.slot.name] = s
        candidates: list[tuple[str, str, list[_Stated], str]] = []
        for s in in_window:
            if s.fact.supersedes:  # Transition: ask for the value before the update (needs both facts)
                old = next(h for h in history if h.fact.fact_id == s.fact.supersedes)
                q = f"What was {person}'s {s.slot.noun} before it became {s.value}?"
                rubric = (
                    f"Full credit only for '{old.value}' (the {s.slot.noun} before it became '{s.value}'). "
                    f"0 for '{s.value}' alone."
                )
                candidates.append((q, old.value, [old, s], rubric))
            elif current_at_end.get(s.slot.name) is s:
                others = [
                    o
                    for o in current_at_end.values()
                    if o.fact.chunk_index != s.fact.chunk_index and o.slot.name != s.slot.name
                ]
                if others:
                    o = rng.choice(sorted(others, key=lambda x: x.fact.fact_id))
                    first, second = sorted([s, o], key=lambda x: x.fact.chunk_index)
                    q = (
                        f"{first.slot.ask.format(p=person).rstrip('?')}, and "
                        f"{second.slot.ask.format(p=person)[0].lower()}{second.slot.ask.format(p=person)[1:]}"
                    )
                    ans = f"{first.value}; {second.value}"
                    rubric = (
                        f"Two facts are asked: {first.slot.noun} '{first.value}' and {second.slot.noun} "
                        f"'{second.value}'. Credit each fact recovered separately."
                    )
                    candidates.append((q, ans, [first, second], rubric))
        rng.shuffle(candidates)
        for k, (q, ans, gold, rubric) in enumerate(candidates[: cfg.num_orm_questions_per_window]):
            out.append(
                OrmQuestion(
                    question_id=question_id(seq_id, w.index, k),
                    sequence_id=seq_id,
                    window_index=w.index,
                    question=q,
                    answer=ans,
                    evidence_chunks=sorted({g.fact.chunk_index for g in gold}),
                    gold_facts=[
                        GoldFact(g.fact.text, g.fact.chunk_index, g.fact.fact_id, g.value) for g in gold
                    ],
                    rubric=rubric,
                )
            )
    return out


def _eval_items(
    seq: Sequence, person: str, stated: dict[str, _Stated], probes: list[Probe]
) -> list[EvalItem]:
    """End-of-stream QA (the demo's evaluation): final value of every slot, plus the traps."""
    items = []
    for s in sorted(stated.values(), key=lambda x: x.fact.fact_id):
        items.append(
            EvalItem(
                item_id=f"{seq.sequence_id}/q{len(items):03d}",
                benchmark="synthetic",
                sequence_id=seq.sequence_id,
                question=s.slot.ask.format(p=person),
                answer=s.value,
                category="transition" if s.fact.supersedes else s.slot.kind.value,
                evidence_turn_ids=list(s.fact.turn_ids),
                evidence_chunks=[s.fact.chunk_index],
            )
        )
    for q in sorted({p.question for p in probes if p.is_trap}):
        items.append(
            EvalItem(
                item_id=f"{seq.sequence_id}/q{len(items):03d}",
                benchmark="synthetic",
                sequence_id=seq.sequence_id,
                question=q,
                answer=NO_SUCH_RECORD,
                category=ProbeKind.SHOULD_NOT_STORE.value,
                evidence_turn_ids=[],
                is_trap=True,
            )
        )
    return items


def generate(cfg: SyntheticConfig) -> SyntheticData:
    if cfg.world not in WORLDS:
        raise ValueError(f"synthetic.world={cfg.world!r}: want one of {WORLDS}")
    out = SyntheticData()
    if cfg.world == "ledger":
        cfg.ledger.validate()
        kinds = ["ledger"] * cfg.num_sequences
    else:
        kinds = sequence_kinds(cfg)
    for n, kind in enumerate(kinds):
        if kind == "ledger":
            one = SyntheticData(**generate_ledger_sequence(cfg, n))
        else:
            one = (
                generate_sequence(cfg, n) if kind == "chat" else generate_agent_sequence(cfg, n, SCENES[kind])
            )
        for name, rows in one.tables().items():
            out.tables()[name].extend(rows)
    return out


def pretraining_documents(
    num_documents: int,
    seed: int,
    episodes_per_document: int = 6,
    mix: tuple[float, ...] = (1 / 3, 1 / 3, 1 / 3, 0.0),
) -> list[str]:
    """Short plain-text documents that stand in for the demo models' pretraining (not a memory task).

    Why: the report's writer and reader are pretrained LLMs, and both tasks are mostly copying (a
    name and a value from the conversation into a fact; a value from a record into an answer). A
    tiny model trained from scratch on the writer/reader demonstrations alone did not learn to copy
    within the demo's budget; dense, short copy episodes teach that skill faster. The fourth kind
    ("talk") imitates the greetings and small talk the harness prompt puts around a fact; it is off by
    default because it delayed the copying phase change. Measured: docs/log/findings.md, "Data".

    Each document has `episodes_per_document` episodes, each about one person, people and values
    drawn independently at random (so no person-value association can be memorised; the demo's
    held-out sequences share nothing with these beyond the vocabulary). `mix` = the shares of:
    - question: "Alice: My dog Rex chewed my shoes again.\\nQuestion: What is the name of Alice's dog? Rex"
    - fact: "Alice: My dog Rex chewed my shoes again.\\nFact: Alice's dog is named Rex"
    - records: "Records: <3 facts of one person>\\nQuestion: <about one of them> <its value>" (lookup
      among distractors, the reader's skill)
    - talk: a friend's greeting, 1-2 fact lines mixed with small talk, a reply, then "Facts: <the
      facts, small talk skipped>" (the writer's skill)
    The formats are plain text, not the harness's JSON or chat template: SFT teaches those.
    Deterministic in (num_documents, seed, episodes_per_document, mix).
    """
    if num_documents < 0 or episodes_per_document < 1:
        raise ValueError("num_documents must be >= 0 and episodes_per_document >= 1")
    if len(mix) != 4 or min(mix) < 0 or abs(sum(mix) - 1) > 1e-6:
        raise ValueError(f"mix = shares of (question, fact, records, talk) episodes summing to 1, got {mix}")
    cuts = [sum(mix[: i + 1]) for i in range(3)]
    rng = random.Random(f"hymem-pretrain:{seed}")
    people = PEOPLE + FRIENDS
    docs = []
    for _ in range(num_documents):
        episodes = []
        for _ in range(episodes_per_document):
            p, kind = rng.choice(people), rng.random()
            if kind < cuts[1]:
                s = rng.choice(SLOTS)
                v = rng.choice(s.values)
                upd = bool(s.update_say) and rng.random() < 0.3
                said = (s.update_say if upd else s.say).format(v=v)
                tail = (
                    f"Question: {s.ask.format(p=p)} {v}"
                    if kind < cuts[0]
                    else f"Fact: {(s.update_fact if upd else s.fact).format(p=p, v=v)}"
                )
                episodes.append(f"{p}: {said}\n{tail}")
            elif kind < cuts[2]:
                slots = rng.sample(SLOTS, 3)
                vals = [rng.choice(s.values) for s in slots]
                k = rng.randrange(3)
                recs = "; ".join(s.fact.format(p=p, v=v) for s, v in zip(slots, vals, strict=True))
                episodes.append(f"Records: {recs}\nQuestion: {slots[k].ask.format(p=p)} {vals[k]}")
            else:
                friend = rng.choice([f for f in FRIENDS if f != p])
                lines, facts = [f"{friend}: {rng.choice(GREETINGS).format(p=p)}"], []
                for s in rng.sample(SLOTS, rng.choice((1, 2))):
                    v = rng.choice(s.values)
                    upd = bool(s.update_say) and rng.random() < 0.3
                    lines.append(f"{p}: {(s.update_say if upd else s.say).format(v=v)}")
                    facts.append((s.update_fact if upd else s.fact).format(p=p, v=v))
                if rng.random() < 0.5:  # small talk, never a fact
                    line, vals, _ = rng.choice(CHITCHAT)
                    lines.insert(rng.randrange(1, len(lines) + 1), f"{p}: {line.format(v=rng.choice(vals))}")
                lines.append(f"{friend}: {rng.choice(REPLIES)}")
                episodes.append("\n".join(lines) + "\nFacts: " + "; ".join(facts))
        docs.append("\n".join(episodes))
    return docs


# ---- working (tool calls) and coding (diffs) episodes ----


@dataclass(frozen=True)
class AgentSlot:
    """One fact of a project an agent's tool call or edit reveals: how it is asked for, carried, stored,
    probed and (maybe) changed. Templates take {p} (the project), {v} (the value), {old} (the value it
    replaces: `initial` before the first statement)."""

    name: str
    kind: ProbeKind
    values: tuple[str, ...]
    request: str  # the user's request
    call: str  # the agent's turn: a tool call, or an edit with its unified diff
    result: str  # the tool's turn: its result
    fact: str  # atomic fact
    ask: str  # probe question ({p})
    noun: str  # what a wrong answer would name, for the rubric
    fact_turn: str = "tool"  # which turn carries the fact: "tool" (the result) or "assistant" (the diff)
    initial: str = ""  # the value before the first statement (the diff's "-" line)
    update_request: str = ""  # "" = never changed
    update_fact: str = ""


def _diff(path: str, before: str, after: str, context: str) -> str:
    return (
        f"Editing {path}:\n```diff\n--- a/{path}\n+++ b/{path}\n@@ -10,3 +10,3 @@\n {context}\n"
        f"-{before}\n+{after}\n```"
    )


WORKING_SLOTS = (
    AgentSlot(
        "host",
        ProbeKind.PLAIN_RECALL,
        ("web-01", "web-07", "web-12", "web-23", "web-31"),
        "Deploy {p} to staging, please.",
        'deploy(service="{p}", env="staging")',
        '{{"status": "ok", "host": "{v}"}}',
        "{p}'s staging deployment runs on host {v}",
        "Which host does {p}'s staging deployment run on?",
        "staging host",
        update_request="Move {p}'s staging deployment to a fresh host.",
        update_fact="{p}'s staging deployment moved to host {v}",
    ),
    AgentSlot(
        "ticket",
        ProbeKind.PLAIN_RECALL,
        ("BUG-101", "BUG-217", "BUG-342", "BUG-480", "BUG-555"),
        "Open a ticket for the {p} login bug.",
        'create_ticket(project="{p}", title="login bug")',
        '{{"ticket": "{v}"}}',
        "The {p} login bug is tracked as ticket {v}",
        "Which ticket tracks the {p} login bug?",
        "ticket id",
    ),
    AgentSlot(
        "port",
        ProbeKind.SPECIFICITY,
        ("5432", "5433", "6432", "15432", "25060"),
        "Which port does the {p} database use? Check its config.",
        'read_file("{p}/db.yaml")',
        "host: db.internal\nport: {v}",
        "{p}'s database listens on port {v}",
        "Which port does {p}'s database listen on?",
        "database port",
        update_request="Switch the {p} database to a new port.",
        update_fact="{p}'s database now listens on port {v}",
    ),
    AgentSlot(
        "owner",
        ProbeKind.MINOR_DIMENSION,
        ("Priya", "Marco", "Yuki", "Omar", "Greta"),
        "Who is on call for {p} this quarter?",
        'lookup_oncall(service="{p}")',
        '{{"owner": "{v}"}}',
        "{v} is {p}'s on-call owner",
        "Who is {p}'s on-call owner?",
        "on-call owner",
        update_request="Hand {p}'s on-call over to someone else.",
        update_fact="{p}'s on-call owner changed to {v}",
    ),
    AgentSlot(
        "room",
        ProbeKind.SEMANTIC_PRECISION,
        ("Orion", "Vega", "Lyra", "Nova", "Castor"),
        "Book a room for the {p} weekly sync.",
        'book_room(meeting="{p} weekly sync")',
        '{{"room": "{v}", "recurring": true}}',
        "{p}'s weekly sync meets in room {v}",
        "Which room does {p}'s weekly sync meet in?",
        "room",
    ),
    AgentSlot(
        "region",
        ProbeKind.PLAIN_RECALL,
        ("eu-west-1", "us-east-2", "ap-south-1", "eu-north-1"),
        "Create the {p} storage bucket.",
        'create_bucket(project="{p}")',
        '{{"bucket": "{p}-data", "region": "{v}"}}',
        "{p}'s storage bucket is in region {v}",
        "Which region is {p}'s storage bucket in?",
        "region",
    ),
)

CODING_SLOTS = (
    AgentSlot(
        "retries",
        ProbeKind.SPECIFICITY,
        ("5", "7", "10", "2", "4"),
        "Change the retry limit in {p}.",
        _diff("{p}/config.py", "MAX_RETRIES = {old}", "MAX_RETRIES = {v}", 'LOG_FORMAT = "json"'),
        "apply_patch: 1 file changed",
        "MAX_RETRIES in {p}/config.py is {v}",
        "What is MAX_RETRIES set to in {p}/config.py?",
        "MAX_RETRIES value",
        "assistant",
        "3",
        "Change the retry limit in {p} again.",
        "MAX_RETRIES in {p}/config.py was changed to {v}",
    ),
    AgentSlot(
        "rename",
        ProbeKind.SPECIFICITY,
        ("fetch_account", "get_member", "read_profile", "lookup_user", "resolve_user"),
        "Give load_user in {p}/api.py a clearer name.",
        _diff("{p}/api.py", "def {old}(uid):", "def {v}(uid):", "@router.get('/users/{{uid}}')"),
        "apply_patch: 1 file changed",
        "load_user in {p}/api.py was renamed to {v}",
        "What is the function load_user in {p}/api.py called now?",
        "function name",
        "assistant",
        "load_user",
    ),
    AgentSlot(
        "port",
        ProbeKind.PLAIN_RECALL,
        ("8080", "9000", "8443", "5000", "7070"),
        "Make {p}'s server listen on another port.",
        _diff("{p}/server.py", "PORT = {old}", "PORT = {v}", "HOST = '0.0.0.0'"),
        "apply_patch: 1 file changed",
        "{p}'s server listens on port {v}",
        "Which port does {p}'s server listen on?",
        "server port",
        "assistant",
        "8000",
        "Move {p}'s server to yet another port.",
        "{p}'s server now listens on port {v}",
    ),
    AgentSlot(
        "pin",
        ProbeKind.SPECIFICITY,
        ("2.31.0", "2.32.3", "2.30.0", "2.29.0"),
        "Bump the requests pin in {p}.",
        _diff("{p}/requirements.txt", "requests=={old}", "requests=={v}", "numpy==1.26.4"),
        "apply_patch: 1 file changed",
        "{p} pins requests to version {v}",
        "Which requests version does {p} pin?",
        "requests version",
        "assistant",
        "2.28.0",
    ),
    AgentSlot(
        "timeout",
        ProbeKind.MINOR_DIMENSION,
        ("45", "60", "90", "120", "15"),
        "Adjust the HTTP timeout in {p}/client.py.",
        _diff("{p}/client.py", "TIMEOUT_S = {old}", "TIMEOUT_S = {v}", "USER_AGENT = 'svc'"),
        "apply_patch: 1 file changed",
        "The HTTP timeout in {p}/client.py is {v} seconds",
        "What is the HTTP timeout in {p}/client.py, in seconds?",
        "timeout",
        "assistant",
        "30",
        "Adjust the HTTP timeout in {p}/client.py once more.",
        "The HTTP timeout in {p}/client.py was changed to {v} seconds",
    ),
    AgentSlot(
        "level",
        ProbeKind.SEMANTIC_PRECISION,
        ("DEBUG", "WARNING", "ERROR", "CRITICAL"),
        "Change the log level of {p}.",
        _diff("{p}/logging.py", 'LEVEL = "{old}"', 'LEVEL = "{v}"', "import logging"),
        "apply_patch: 1 file changed",
        "{p}'s log level is {v}",
        "What log level does {p} use?",
        "log level",
        "assistant",
        "INFO",
    ),
)


@dataclass(frozen=True)
class Scene:
    name: str
    projects: tuple[str, ...]
    slots: tuple[AgentSlot, ...]
    # transient tool output: (request, call, result with {v}, values, trap question about a lasting setting)
    transient: tuple[tuple[str, str, str, tuple[str, ...], str], ...]
    opening: tuple[str, ...]
    closing: tuple[str, ...]


SCENES = {
    "working": Scene(
        "working",
        ("Atlas", "Borealis", "Cobalt", "Dynamo", "Ember", "Falcon"),
        WORKING_SLOTS,
        (
            (
                "How is {p} doing right now?",
                'check_status(service="{p}")',
                '{{"cpu": "{v}", "as_of": "now"}}',
                ("41%", "77%", "12%", "93%"),
                "What CPU limit is configured for {p}?",
            ),
            (
                "What time is it on the {p} box?",
                'run("date", host="{p}")',
                "{v} UTC",
                ("14:32", "09:05", "17:48"),
                "At what time does {p}'s nightly job run?",
            ),
            (
                "How long is the {p} job queue?",
                'queue_length(service="{p}")',
                '{{"waiting": {v}}}',
                ("3", "17", "42"),
                "What is the maximum queue size configured for {p}?",
            ),
        ),
        ("New task on {p}.", "Picking {p} back up.", "Another {p} request."),
        ("Done.", "All set.", "That is taken care of."),
    ),
    "coding": Scene(
        "coding",
        ("payments", "search", "ledger", "gateway", "inventory", "notify"),
        CODING_SLOTS,
        (
            (
                "Run the {p} tests.",
                'run("pytest -q", cwd="{p}")',
                "{v} passed in 3.2s",
                ("12", "48", "97"),
                "How many tests must pass before {p} can be released?",
            ),
            (
                "What is the state of the {p} checkout?",
                'run("git status", cwd="{p}")',
                "On branch {v}, 2 files changed",
                ("wip-xyz", "scratch", "tmp-fix"),
                "What is {p}'s release branch?",
            ),
            (
                "How big is the {p} build?",
                'run("du -sh build/", cwd="{p}")',
                "{v}\tbuild/",
                ("12M", "340K", "1.1G"),
                "What is the size limit for {p}'s build?",
            ),
        ),
        ("Let's work on {p}.", "Back to the {p} repo.", "One more change in {p}."),
        ("Pushed.", "The tests still pass.", "Done, ready for review."),
    ),
}
EPISODE_KINDS = ("chat", *SCENES)


def sequence_kinds(cfg: SyntheticConfig) -> list[str]:
    """The episode kind of each sequence: the mix's shares by largest remainder, placed by a shuffle of
    its own seed (chat alone draws nothing, so the chat data is what it was before the other kinds)."""
    mix = dict(cfg.mix) or {"chat": 1.0}
    unknown = sorted(set(mix) - set(EPISODE_KINDS))
    if unknown or min(mix.values()) < 0 or sum(mix.values()) <= 0:
        raise ValueError(f"synthetic.mix: shares >= 0 (sum > 0) of {list(EPISODE_KINDS)}, got {mix}")
    total, n = sum(mix.values()), cfg.num_sequences
    kinds = [k for k in EPISODE_KINDS if mix.get(k, 0) > 0]
    exact = {k: mix[k] / total * n for k in kinds}
    count = {k: int(exact[k]) for k in kinds}
    for k in sorted(kinds, key=lambda k: (count[k] - exact[k], EPISODE_KINDS.index(k)))[
        : n - sum(count.values())
    ]:
        count[k] += 1
    out = [k for k in kinds for _ in range(count[k])]
    if len(kinds) > 1:
        random.Random(f"hymem-synth-mix:{cfg.seed}").shuffle(out)
    return out


def generate_agent_sequence(cfg: SyntheticConfig, n: int, scene: Scene) -> SyntheticData:
    """A working or coding sequence: one session per chunk, in which the user asks for 1-2 things, the
    agent calls a tool or edits a file, and the turn that carries each fact is its gold evidence."""
    rng = random.Random(f"hymem-synth-{scene.name}:{cfg.seed}:{n}")
    project = scene.projects[n % len(scene.projects)]
    if n >= len(scene.projects) and cfg.unique_person_names:
        project += f"-{n // len(scene.projects)}"
    seq_id = f"synth/{cfg.seed}/{n:04d}"
    start = dt.date.fromisoformat(cfg.start_date)
    out = SyntheticData()
    stated: dict[str, _Stated] = {}
    history: list[_Stated] = []
    free = list(scene.slots)
    rng.shuffle(free)
    sessions: list[Session] = []
    per_chunk: list[dict] = []
    for t in range(cfg.num_chunks_per_sequence):
        turns: list[Turn] = []
        probes: list[tuple[ProbeKind, str, str, str, bool, list[str]]] = []
        facts: list[Fact] = []

        def say(speaker: str, text: str, _t: int = t, _turns: list[Turn] = turns) -> str:
            _turns.append(Turn(turn_id=f"D{_t + 1}:{len(_turns) + 1}", speaker=speaker, text=text))
            return _turns[-1].turn_id

        def state(slot: AgentSlot, value: str, old: str, update: bool, _t: int = t, _f: list = facts) -> Fact:
            p = project
            say("user", (slot.update_request if update else slot.request).format(p=p))
            ids = {"assistant": say("assistant", slot.call.format(p=p, v=value, old=old))}
            ids["tool"] = say("tool", slot.result.format(p=p, v=value, old=old))
            text = (slot.update_fact if update else slot.fact).format(p=p, v=value)
            prev = stated[slot.name].fact.fact_id if update else ""
            _f.append(Fact(fact_id(seq_id, _t, len(_f)), seq_id, _t, text, [ids[slot.fact_turn]], prev))
            return _f[-1]

        say("user", rng.choice(scene.opening).format(p=project))
        changeable = [s for s in stated.values() if s.slot.update_request and s.current]
        num_new = 1 + (rng.random() < cfg.second_fact_prob)
        if t >= 2 and changeable and rng.random() < cfg.update_prob:
            old = rng.choice(sorted(changeable, key=lambda s: s.slot.name))
            used = {h.value for h in history if h.slot.name == old.slot.name}
            value = rng.choice(
                [v for v in old.slot.values if v not in used]
                or [v for v in old.slot.values if v != old.value]
            )
            f = state(old.slot, value, old.value, True)
            old.current = False
            stated[old.slot.name] = _Stated(f, old.slot, value)  # type: ignore[arg-type]
            history.append(stated[old.slot.name])
            rubric = _rubric_transition(old.slot.noun, value, old.value)
            probes.append(
                (ProbeKind.TRANSITION, old.slot.ask.format(p=project), value, rubric, False, [f.fact_id])
            )
            num_new -= 1
        for _ in range(num_new):
            if not free:
                break
            slot = free.pop()
            value = rng.choice(slot.values)
            f = state(slot, value, slot.initial, False)
            stated[slot.name] = _Stated(f, slot, value)  # type: ignore[arg-type]
            history.append(stated[slot.name])
            rubric = _rubric_exact(slot.noun, value)
            probes.append((slot.kind, slot.ask.format(p=project), value, rubric, False, [f.fact_id]))
        if rng.random() < cfg.chitchat_prob:
            request, call, result, values, trap_q = rng.choice(scene.transient)
            say("user", request.format(p=project))
            say("assistant", call.format(p=project))
            say("tool", result.format(p=project, v=rng.choice(values)))
            rubric = (
                f"No such setting of {project} was ever recorded; only a passing tool output exists. Full "
                "credit only if the answer says there is no such record; 0 if it names anything."
            )
            probes.append(
                (ProbeKind.SHOULD_NOT_STORE, trap_q.format(p=project), NO_SUCH_RECORD, rubric, True, [])
            )
        say("assistant", rng.choice(scene.closing))
        date = (start + dt.timedelta(days=7 * t)).isoformat()
        sessions.append(Session(session_id=f"session_{t + 1}", date=date, turns=turns))
        per_chunk.append({"facts": facts, "probes": probes})

    seq = Sequence(seq_id, f"synthetic_{scene.name}", sessions, speakers=["user", "assistant", "tool"])
    out.sequences.append(seq)
    chunking = ChunkingConfig(mode="session", num_chunks_per_window=cfg.num_chunks_per_window)
    out.chunks = chunk_sequence(seq, chunking)
    out.windows = build_windows(out.chunks, cfg.num_chunks_per_window)
    for t, pc in enumerate(per_chunk):
        out.facts += pc["facts"]
        for k, (kind, q, ref, rubric, trap, fids) in enumerate(pc["probes"]):
            out.probes.append(Probe(probe_id(seq_id, t, k), seq_id, t, kind, q, ref, rubric, trap, fids))
    out.orm_questions = _orm_questions(cfg, rng, seq_id, project, out.windows, history)
    out.eval_items = _eval_items(seq, project, stated, out.probes)
    return out
