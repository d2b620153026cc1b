"""Gold memories of a real-data chunk (LoCoMo, LongMemEval), as the write replies of a framework.

`SourceGold` is the "gold bank" writer's reply function on real data, as `LedgerOracle`
(data_pipeline/ledger_oracle.py) is on the ledger world. It reads a framework's write prompt, finds
which chunk of the planned data is being written, and replies, in that framework's own reply format,
with the chunk's gold memories, so they reach the bank through the harness's own write path:

- LoCoMo: the source's observations (`Fact` rows) of the chunk;
- LongMemEval: the text of the chunk's evidence turns (`Turn.has_answer`), as "<role>: <text>";
- each dated by the session its turn was said in: "<memory> (said on 8 May 2023)", the only date a
  reader has for a "when" question (reward/lexical.py reads it).

Which chunk: a turn is found in a prompt by its rendered text (`chunk_messages`, what the writer is
shown), lower-cased with everything but letters and digits dropped, first `FINGERPRINT_CHARS`
characters, as is or as a JSON string shows it (hy-memory lists the new messages as JSON). mem0 and hy-memory show earlier chunks' turns too ("Last k Messages"), so the chunk being
written is the latest chunk of a sequence all of whose turns are in the prompt (a LongMemEval session
shared by two sequences: the sequence with more whole chunks); its memories only are written, each once. A write prompt in which no chunk is whole gets no memories (counted in
`counts["unmatched"]`): the gold bank then lacks them, and the count says so.

Reply formats (framework versions pinned in harnesses/venv_locks):
- native: {"ops": [{"op": "ADD", "text": ...}]} ({"op": "NONE"} for a chunk without gold);
- mem0 (V3 additive extraction): {"memory": [{"id": "0", "text": ...}]};
- hy-memory chat extraction: a ```json block {"memory": [{"content", "tags", "owner"}], ...};
  its reconcile calls get {} (the framework's default: keep what was extracted).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from dataclasses import dataclass, field

from data_pipeline.chunking import iso_date, render_turn
from data_pipeline.schema import Chunk

FINGERPRINT_CHARS = 64  # enough to tell two turns apart; earlier turns that a framework cuts keep their head
UNMATCHED_KEPT, UNMATCHED_CHARS = 5, 600  # unmatched prompts kept for the run's record: how many, their tails
MIN_FINGERPRINT_CHARS = 12  # a shorter turn ("Ok!") cannot identify a chunk; it is not required

# framework -> markers of its write prompts, tested in this order (the first marker that occurs wins)
_KINDS = (
    ("hy_memory_reconcile", "You are a memory management system"),
    ("hy_memory", "Extract durable, high-value memories"),
    ("mem0", "evidence-bound processor"),
    ("native", "New conversation:"),
)
FRAMEWORKS = ("native", "mem0", "hy_memory")  # the write paths SourceGold replies for


def fingerprint(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def prompt_kind(prompt: str) -> str:
    """Which framework's write prompt this is; ValueError for one SourceGold cannot answer."""
    for kind, marker in _KINDS:
        if marker in prompt:
            return kind
    raise ValueError(f"gold writer: not a write prompt of {FRAMEWORKS}: {prompt[:160]!r}")


def turn_text(turn) -> str:
    """A turn as the writer is shown it (rollout.worker.chunk_messages)."""
    return turn.text if turn.speaker in ("user", "assistant") else render_turn(turn)


def spoken_date(date: str) -> str:
    """A session date as a reader and a judge read it ("8 May 2023"); the source's text when unparsed."""
    try:
        d = dt.datetime.fromisoformat(iso_date(date))
    except ValueError:
        return date
    return f"{d.day} {d:%B %Y}"


def gold_memories(dataset) -> dict[tuple[str, int], list[str]]:
    """(sequence_id, chunk index) -> the chunk's dated gold memories, by the module docstring's rules."""
    dates = {
        (s.sequence_id, t.turn_id): se.date
        for s in dataset.tables["sequences"]
        for se in s.sessions
        for t in se.turns
    }
    out: dict[tuple[str, int], list[str]] = {}
    for f in dataset.tables.get("facts", []):
        date = dates.get((f.sequence_id, f.turn_ids[-1]), "") if f.turn_ids else ""
        out.setdefault((f.sequence_id, f.chunk_index), []).append(_dated(f.text, date))
    for c in dataset.tables["chunks"]:
        for t in c.turns:
            if t.has_answer:
                said = f"{t.speaker}: {t.text}" if t.speaker in ("user", "assistant") else render_turn(t)
                date = dates.get((c.sequence_id, t.turn_id), c.date)
                out.setdefault((c.sequence_id, c.index), []).append(_dated(said, date))
    return out


def _dated(text: str, date: str) -> str:
    return f"{text.strip()} (said on {spoken_date(date)})" if date else text.strip()


def has_gold(dataset) -> bool:
    """Whether the data holds gold memories: observations (facts) or evidence turns."""
    return bool(gold_memories(dataset))


@dataclass
class _Chunk:
    key: tuple[str, int]
    prints: list[tuple[str, ...]]  # per turn long enough to identify it: its fingerprints as shown


@dataclass
class SourceGold:
    """Callable: a framework's write prompt -> its gold reply. `datasets`: framework -> the built dataset
    its harness writes (the chunking differs between profiles)."""

    datasets: dict[str, object]
    counts: dict[str, int] = field(default_factory=dict)  # replies by kind, memories written, unmatched
    unmatched: list[str] = field(default_factory=list)  # the first UNMATCHED_KEPT such prompts' heads

    def __post_init__(self) -> None:
        unknown = sorted(set(self.datasets) - set(FRAMEWORKS))
        if unknown:
            raise ValueError(f"gold writer on real data: no write path for {unknown} (it knows {FRAMEWORKS})")
        self._chunks: dict[str, list[_Chunk]] = {}
        self._gold: dict[str, dict[tuple[str, int], list[str]]] = {}
        for fw, d in self.datasets.items():
            self._gold[fw] = gold_memories(d)
            self._chunks[fw] = [_index(c) for c in d.tables["chunks"]]
        self._lock = threading.Lock()  # the gateway may call from several threads (parallel builds)

    def _count(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + n

    def chunk_of(self, framework: str, prompt: str) -> tuple[str, int] | None:
        """The chunk being written: of the chunks whose every identifying turn is in the prompt, the latest
        of its sequence; where two sequences share a session, the sequence with more whole chunks."""
        if framework not in self._chunks:
            raise ValueError(
                f"gold writer: a {framework} write prompt, but no {framework} harness is planned"
            )
        text = fingerprint(prompt)
        by_seq: dict[str, list[_Chunk]] = {}
        for c in self._chunks[framework]:
            if c.prints and all(any(p in text for p in alts) for alts in c.prints):
                by_seq.setdefault(c.key[0], []).append(c)
        if not by_seq:
            return None
        seq = max(by_seq, key=lambda q: (len(by_seq[q]), q))
        return max(by_seq[seq], key=lambda c: c.key[1]).key

    def memories(self, framework: str, prompt: str) -> list[str]:
        key = self.chunk_of(framework, prompt)
        if key is None:
            self._count("unmatched")
            with self._lock:
                if len(self.unmatched) < UNMATCHED_KEPT:
                    self.unmatched.append(f"{framework}: {prompt[-UNMATCHED_CHARS:]}")
            return []
        mems = self._gold[framework].get(key, [])
        self._count("memories", len(mems))
        return mems

    def __call__(self, prompt: str) -> str:
        kind = prompt_kind(prompt)
        self._count(kind)
        if kind == "hy_memory_reconcile":
            return "{}"
        if kind == "native":
            _, _, new = prompt.rpartition("New conversation:")
            mems = self.memories(kind, prompt.rpartition("Existing memories:")[0] + new)
            ops = [{"op": "ADD", "text": t} for t in mems] or [{"op": "NONE"}]
            return json.dumps({"ops": ops})
        mems = self.memories(kind, prompt)
        if kind == "mem0":
            return json.dumps({"memory": [{"id": str(j), "text": t} for j, t in enumerate(mems)]})
        body = {
            "memory": [{"content": t, "tags": [], "owner": "user"} for t in mems],
            "intentions": [],
            "basic_info": {},
        }
        return "```json\n" + json.dumps(body) + "\n```"


def _index(c: Chunk) -> _Chunk:
    prints = [_shown(turn_text(t)) for t in c.turns]
    return _Chunk((c.sequence_id, c.index), [p for p in prints if len(p[0]) >= MIN_FINGERPRINT_CHARS])


def _shown(text: str) -> tuple[str, ...]:
    """A turn's fingerprints as a prompt may show it: as is, or inside a JSON string (hy-memory lists the
    new messages as JSON, where a line break is "\\n" and "’" may be "\\u2019")."""
    forms = (text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1])
    return tuple(dict.fromkeys(fingerprint(f)[:FINGERPRINT_CHARS] for f in forms))
