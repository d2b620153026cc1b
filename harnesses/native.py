"""Native harness: a compact Mem0-style protocol on SQLite + FTS5, in-process, no venv.

One LLM call per chunk: the prompt holds the chunk and the top-k existing memories (FTS5 bm25 over
the chunk's words); the reply is JSON operations ADD / UPDATE / DELETE / NONE, applied in one SQLite
transaction (nothing half-written). Prompts are short so a tiny model can learn the format on CPU.

Parsing is lenient but honest (silent failure malformed-as-platform-error): code fences, prose around the JSON, trailing
commas and a bare list of ops are accepted; but a reply that only parsed after repair and yields no
memory change is a POLICY_ERROR, never "success with zero memories". A reply that parsed cleanly
and says NONE is a legitimate ok (nothing worth storing).

Canonical entry text (size_tokens): the memory's `text` column, nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sqlite3
from pathlib import Path
from typing import Any

from harnesses.base import (
    BankLock,
    BankMetadata,
    BankStateError,
    ConfigurationError,
    Endpoint,
    Harness,
    MemoryEntry,
    Message,
    WriteResult,
    WriteStatus,
    checked_read_all,
    config_hash,
    open_or_create_bank_dir,
    validate_messages,
)

log = logging.getLogger(__name__)

NATIVE_VERSION = "1"  # bump when the schema or the protocol changes (old banks are then refused)
DB_FILE = "memories.sqlite"
CHUNK_INDEX_HEADER = "X-Hymem-Chunk-Index"

SYSTEM_PROMPT = (
    "You manage a memory bank about the user. Read the new conversation and the existing memories. "
    'Reply with JSON only: {"ops": [...]} where each op is one of '
    '{"op":"ADD","text":"<new fact>"}, {"op":"UPDATE","id":<id>,"text":"<corrected fact>"}, '
    '{"op":"DELETE","id":<id>}, {"op":"NONE"}. '
    "Store durable, specific facts with dates; skip small talk."
)


@dataclasses.dataclass
class NativeConfig:
    num_context_memories: int = 8  # existing memories shown to the policy (FTS5 top-k over the chunk)
    max_tokens: int = 512  # response budget per call
    temperature: float = 1.0  # sampling temperature sent to the gateway (on-policy rollouts)
    max_memory_chars: int = 1000  # an ADD/UPDATE text longer than this is an invalid op (policy error)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    text TEXT NOT NULL,
    session_id TEXT NOT NULL,
    date TEXT NOT NULL,
    created_chunk INTEGER,
    updated_chunk INTEGER
);
CREATE VIRTUAL TABLE IF NOT EXISTS memories_fts USING fts5(text, content='memories', content_rowid='id');
CREATE TRIGGER IF NOT EXISTS memories_ai AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts(rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS memories_ad AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TRIGGER IF NOT EXISTS memories_au AFTER UPDATE ON memories BEGIN
    INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO memories_fts(rowid, text) VALUES (new.id, new.text);
END;
"""


# --------------------------------------------------------------------------------------------- parsing
@dataclasses.dataclass(frozen=True)
class ParsedOps:
    ops: list[dict[str, Any]]  # raw op dicts (validated later against the bank)
    repaired: bool  # True when the reply was only parseable after lenient repair


_FENCE_RE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)
_TRAILING_COMMA_RE = re.compile(r",\s*([\]}])")


def parse_ops(reply: str) -> ParsedOps | None:
    """JSON ops from an LLM reply; None when nothing usable parses. Pure function."""
    text = reply.strip()
    try:
        obj = json.loads(text)
    except ValueError:
        pass
    else:
        try:
            return _ops_from(obj, repaired=False)
        except (ValueError, TypeError):
            return None
    candidates = [m.group(1) for m in _FENCE_RE.finditer(text)]
    for open_c, close_c in (("{", "}"), ("[", "]")):
        i, j = text.find(open_c), text.rfind(close_c)
        if 0 <= i < j:
            candidates.append(text[i : j + 1])
    for cand in candidates:
        for fixed in (cand, _TRAILING_COMMA_RE.sub(r"\1", cand)):
            try:
                obj = json.loads(fixed)
            except ValueError:
                continue
            try:
                return _ops_from(obj, repaired=True)
            except (ValueError, TypeError):
                # the reply's JSON has no ops: do not dig further into it for something op-shaped
                return None
    return None


def _ops_from(obj: Any, *, repaired: bool) -> ParsedOps:
    if isinstance(obj, dict):
        if "ops" in obj:
            obj = obj["ops"]
        elif "op" in obj:  # a single op without the wrapper
            obj, repaired = [obj], True
        else:
            raise ValueError("no ops")
    if not isinstance(obj, list):
        raise TypeError("ops is not a list")
    return ParsedOps(ops=obj, repaired=repaired)


# --------------------------------------------------------------------------------------------- harness
class NativeHarness(Harness):
    framework = "native"

    def __init__(self, llm: Endpoint | None, config: NativeConfig | None = None, *, scene: str = "default"):
        if scene != "default":
            raise ConfigurationError(f"native harness: unknown scene {scene!r} (only 'default')")
        self.llm = llm
        self.config = config or NativeConfig()
        self.scene = scene
        self._db: sqlite3.Connection | None = None
        self._lock: BankLock | None = None
        self._meta: BankMetadata | None = None
        self._bank_dir: Path | None = None
        # httpx imported here, not at module top: the sandbox imports this module inside every
        # framework venv, and not all of them ship httpx
        import httpx

        self._httpx = httpx
        self._http = httpx.Client(timeout=llm.timeout_s) if llm is not None else None

    # ---- identity
    def _expected_meta(self) -> BankMetadata:
        cfg = dataclasses.asdict(self.config)
        cfg.pop("temperature")  # sampling knob, not bank behaviour: forks across temperatures stay compatible
        return BankMetadata(
            framework=self.framework,
            framework_version=NATIVE_VERSION,
            scene=self.scene,
            config_hash=config_hash({"native": cfg, "system_prompt": SYSTEM_PROMPT}),
            bank_id="",
        )

    # ---- lifecycle
    def open(self, bank_dir, *, create: bool = False) -> BankMetadata:
        if self._db is not None:
            raise BankStateError(f"{self._bank_dir}: this harness already has a bank open")
        bank_dir = Path(bank_dir)
        expected = self._expected_meta()
        meta, created = open_or_create_bank_dir(bank_dir, expected, create)
        if not created and not (bank_dir / DB_FILE).exists():
            raise BankStateError(f"{bank_dir}: bank.json present but {DB_FILE} missing")
        lock = BankLock(bank_dir)
        lock.acquire()
        try:
            db = sqlite3.connect(bank_dir / DB_FILE, isolation_level=None, check_same_thread=False)
            # rollback journal (not WAL): a closed bank is exactly one file, so fork is one copy
            db.execute("PRAGMA journal_mode=DELETE")
            db.executescript(_SCHEMA)
        except BaseException:
            lock.release()
            raise
        self._db, self._lock, self._meta, self._bank_dir = db, lock, meta, bank_dir
        return meta

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        self._release_bank()

    def shutdown(self) -> None:
        self.close()
        if self._http is not None:
            self._http.close()

    def _need_db(self) -> sqlite3.Connection:
        if self._db is None:
            raise BankStateError("native harness: no bank open")
        return self._db

    def metadata(self) -> BankMetadata:
        self._need_db()
        assert self._meta is not None
        return self._meta

    # ---- reads
    def count(self) -> int:
        return self._need_db().execute("SELECT COUNT(*) FROM memories").fetchone()[0]

    def read_all(self) -> list[MemoryEntry]:
        rows = (
            self._need_db().execute("SELECT id, text, session_id, date FROM memories ORDER BY id").fetchall()
        )
        entries = [
            MemoryEntry(id=str(r[0]), text=r[1], metadata={"session_id": r[2], "date": r[3]}) for r in rows
        ]
        return checked_read_all(entries, self.count(), f"native bank {self._bank_dir}")

    def search(self, query: str, k: int) -> list[MemoryEntry]:
        terms = re.findall(r"\w+", query.lower())
        if not terms or k <= 0:
            return []
        # quoted terms OR-ed: free text must never be parsed as FTS5 syntax
        match = " OR ".join('"' + t.replace('"', "") + '"' for t in dict.fromkeys(terms))
        rows = (
            self._need_db()
            .execute(
                "SELECT m.id, m.text, m.session_id, m.date, bm25(memories_fts) AS s FROM memories_fts "
                "JOIN memories m ON m.id = memories_fts.rowid WHERE memories_fts MATCH ? ORDER BY s LIMIT ?",
                (match, k),
            )
            .fetchall()
        )
        return [
            MemoryEntry(id=str(r[0]), text=r[1], metadata={"session_id": r[2], "date": r[3]}, score=-r[4])
            for r in rows
        ]

    # ---- write path
    def build_prompt(self, messages: list[Message], session_id: str, date: str) -> list[Message]:
        chunk_text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        existing = self.search(chunk_text, self.config.num_context_memories)
        mem_lines = "\n".join(f"[{e.id}] {e.text}" for e in existing) or "(none)"
        user = f"Session {session_id}, date {date}.\nExisting memories:\n{mem_lines}\n\nNew conversation:\n{chunk_text}"
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    def write_chunk(self, messages, session_id, date, *, chunk_index=None) -> WriteResult:
        db = self._need_db()
        validate_messages(messages)
        if self.llm is None or self._http is None:
            raise BankStateError("native harness: opened without an LLM endpoint, cannot write")
        prompt = self.build_prompt(messages, session_id, date)
        headers = {"Authorization": f"Bearer {self.llm.api_key}"}
        if chunk_index is not None:
            headers[CHUNK_INDEX_HEADER] = str(chunk_index)
        body = {
            "model": self.llm.model,
            "messages": prompt,
            "max_tokens": self.config.max_tokens,
            "temperature": self.config.temperature,
        }
        try:
            resp = self._http.post(
                self.llm.base_url.rstrip("/") + "/chat/completions", json=body, headers=headers
            )
        except self._httpx.HTTPError as e:
            return WriteResult(
                WriteStatus.PLATFORM_ERROR,
                0,
                f"LLM request failed: {type(e).__name__}: {e}",
                writer_timeout=isinstance(e, self._httpx.TimeoutException),
            )
        if resp.status_code != 200:
            # 401/403 is an identity rejection by the gateway: a platform fault, not policy behaviour
            return WriteResult(
                WriteStatus.PLATFORM_ERROR, 0, f"LLM endpoint HTTP {resp.status_code}: {resp.text[:200]}"
            )
        try:
            reply = resp.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError) as e:
            return WriteResult(
                WriteStatus.PLATFORM_ERROR, 1, f"LLM endpoint returned a malformed body: {e!r}"
            )
        return self._apply_reply(db, reply, session_id, date, chunk_index)

    def apply_ops(
        self, reply: str, session_id: str, date: str, chunk_index: int | None = None
    ) -> WriteResult:
        """A write without the LLM call: `reply` (JSON ops, as a writer would answer) goes down the
        same parse-and-apply path as `write_chunk`'s reply. Fills a bank with given records (the reader
        self-checks, reward.reader_checks); opened without an endpoint is fine. No LLM call is made,
        so the result counts none."""
        res = self._apply_reply(self._need_db(), reply, session_id, date, chunk_index)
        return dataclasses.replace(res, num_llm_calls=0)

    def _apply_reply(
        self, db: sqlite3.Connection, reply: str, session_id: str, date: str, chunk_index: int | None
    ) -> WriteResult:
        parsed = parse_ops(reply)
        if parsed is None:
            return WriteResult(WriteStatus.POLICY_ERROR, 1, f"reply is not JSON ops: {reply[:120]!r}")
        added = updated = deleted = nones = 0
        invalid: list[str] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            for i, op in enumerate(parsed.ops):
                kind, why = self._apply_op(db, op, session_id, date, chunk_index)
                if why is None:
                    added += kind == "ADD"
                    updated += kind == "UPDATE"
                    deleted += kind == "DELETE"
                    nones += kind == "NONE"
                else:
                    invalid.append(f"ops[{i}]: {why}")
            db.execute("COMMIT")
        except sqlite3.Error as e:
            db.execute("ROLLBACK")
            return WriteResult(WriteStatus.PLATFORM_ERROR, 1, f"sqlite write failed: {e}")
        changes = added + updated + deleted
        detail = "; ".join(invalid)[:500] or None
        if changes == 0 and (parsed.repaired or invalid or nones == 0):
            # silent failure malformed-as-platform-error: "success with zero memories" after lenient repair is policy behaviour
            why = "repaired JSON" if parsed.repaired else ("only invalid ops" if invalid else "empty op list")
            return WriteResult(
                WriteStatus.POLICY_ERROR, 1, f"no memory change from {why}: {detail or reply[:120]!r}"
            )
        return WriteResult(
            WriteStatus.OK, 1, detail, num_added=added, num_updated=updated, num_deleted=deleted
        )

    def _apply_op(
        self, db: sqlite3.Connection, op: Any, session_id: str, date: str, chunk_index: int | None
    ) -> tuple[str, str | None]:
        """Apply one op; return (kind, why it is invalid or None when applied)."""
        if not isinstance(op, dict):
            return "", f"not an object: {op!r:.60}"
        kind = str(op.get("op", op.get("event", ""))).upper()
        return kind, self._apply_kind(db, kind, op, session_id, date, chunk_index)

    def _apply_kind(
        self, db: sqlite3.Connection, kind: str, op: dict, session_id: str, date: str, chunk_index: int | None
    ) -> str | None:
        text = op.get("text")
        if kind in ("ADD", "UPDATE"):
            if not isinstance(text, str) or not text.strip():
                return f"{kind} without text"
            if len(text) > self.config.max_memory_chars:
                return f"{kind} text longer than {self.config.max_memory_chars} chars"
        if kind == "ADD":
            db.execute(
                "INSERT INTO memories(text, session_id, date, created_chunk, updated_chunk) VALUES (?,?,?,?,?)",
                (text.strip(), session_id, date, chunk_index, chunk_index),
            )
            return None
        if kind in ("UPDATE", "DELETE"):
            try:
                mid = int(op.get("id"))
            except (TypeError, ValueError):
                return f"{kind} with bad id {op.get('id')!r:.30}"
            if kind == "UPDATE":
                cur = db.execute(
                    "UPDATE memories SET text=?, date=?, updated_chunk=? WHERE id=?",
                    (text.strip(), date, chunk_index, mid),
                )
            else:
                cur = db.execute("DELETE FROM memories WHERE id=?", (mid,))
            return None if cur.rowcount == 1 else f"{kind} of unknown id {mid}"
        if kind == "NONE":
            return None
        return f"unknown op {kind!r:.30}"
