"""Gold (and deliberately flawed) native-harness operations for a ledger-world chunk.

`LedgerOracle` reads the native harness's write prompt (harnesses/native.py `build_prompt`: the
session date, the existing memories as "[id] text" lines, the chunk as "user: <speaker>: <text>"
lines) and replies with the JSON operations a writer should produce:

- a new fact: ADD "<attr>: <value>";
- a change: UPDATE the key's record, appending ", then <value> (<date>)" (every state kept);
- a restatement, a transient line, a greeting: nothing; a chunk with nothing to store: NONE.

With `Flaws` it is the demo's imperfect teacher: the report's teacher is strong but imperfect and RL
goes beyond it, so the teacher's demonstrations carry documented flaws, each at a rate and decided
per line by a seeded hash (reproducible):
- `store_small_talk`: ADD the transient line as if it were a fact (the trap probes see it);
- `drop_history`: a change overwrites the record with the new state only (the history question sees it);
- `duplicate_restatement`: ADD a restated fact a second time (the growth penalty sees it).
With no flaws it writes the gold bank through the harness's own write path (the "gold bank" bound).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from data_pipeline.ledger import normalise_key, parse_record, parse_statement, record_text

_LINE_RE = re.compile(r"^user: (?P<speaker>[^:]+): (?P<text>.+)$")
_DATE_RE = re.compile(r"^Session [^,]*, date (?P<date>[^.\n]+)\.", re.M)


@dataclass
class Flaws:
    """Rates of the planted teacher flaws (0 = the gold writer)."""

    store_small_talk: float = 0.0  # share of transient lines stored as facts
    drop_history: float = 0.0  # share of changes that keep only the new state
    duplicate_restatement: float = 0.0  # share of restatements stored a second time
    seed: int = 0  # the per-line draws are a hash of (seed, date, line)

    def validate(self) -> None:
        for k in ("store_small_talk", "drop_history", "duplicate_restatement"):
            if not 0.0 <= getattr(self, k) <= 1.0:
                raise ValueError(f"flaws.{k}={getattr(self, k)}: want a rate in [0, 1]")


def _draw(seed: int, date: str, line: str, what: str) -> float:
    h = hashlib.sha256(f"{seed}|{date}|{line}|{what}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


@dataclass
class LedgerOracle:
    """Callable: native write prompt -> JSON ops (a ScriptedEngine reply function)."""

    flaws: Flaws = field(default_factory=Flaws)
    counts: dict[str, int] = field(default_factory=dict)  # what it did, by kind (the demo reports them)

    def _count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def __call__(self, prompt: str) -> str:
        head, _, new = prompt.rpartition("New conversation:")
        m = _DATE_RE.search(head)
        date = m.group("date").strip() if m else ""
        existing: dict[str, tuple[int, list[tuple[str, str]]]] = {}
        for mid, text in re.findall(r"^\[(\d+)\] (.+)$", head, re.M):
            rec = parse_record(text)
            if rec is not None:
                existing[normalise_key(rec.key)] = (int(mid), list(rec.states))
        ops: list[dict] = []
        for raw in new.splitlines():
            lm = _LINE_RE.match(raw.strip())
            st = parse_statement(lm.group("text")) if lm else None
            if st is None:
                continue
            kind, attr, value = st
            key = normalise_key(attr)
            f = self.flaws
            if kind == "new":
                ops.append({"op": "ADD", "text": record_text(attr, [(value, "")])})
                self._count("add")
            elif kind == "update" and key in existing:
                mid, states = existing[key]
                if _draw(f.seed, date, raw, "history") < f.drop_history:
                    states = [(value, "")]
                    self._count("flaw_drop_history")
                else:
                    states = [*states, (value, date)]
                    self._count("update")
                existing[key] = (mid, states)
                ops.append({"op": "UPDATE", "id": mid, "text": record_text(attr, states)})
            elif kind == "update":  # the record is not among the shown memories: the best a writer can do
                ops.append({"op": "ADD", "text": record_text(attr, [(value, "")])})
                self._count("update_unseen")
            elif kind == "restate" and _draw(f.seed, date, raw, "dup") < f.duplicate_restatement:
                ops.append({"op": "ADD", "text": record_text(attr, [(value, "")])})
                self._count("flaw_duplicate_restatement")
            elif kind == "transient" and _draw(f.seed, date, raw, "talk") < f.store_small_talk:
                ops.append({"op": "ADD", "text": record_text(attr, [(value, "")])})
                self._count("flaw_store_small_talk")
            else:
                self._count(f"skip_{kind}")
        return json.dumps({"ops": ops or [{"op": "NONE"}]})
