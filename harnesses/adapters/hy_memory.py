"""hy-memory (PyPI `hy-memory` 2.0.6) as a harness, scenes chat | working | coding.

Imported only inside the `.venvs/hy_memory` sandbox. Mode `pro` (LLM extraction + reconcile, no
graph server, no System 2); local stores only: Chroma (vector_db/), SQLite cache/history, and for
working/coding the `coding_memory[_cv].db` SQLite files; all under `<bank>/data` (MEMORY_DATA_DIR).

Write path: `HyMemoryClient.add(messages, scene=..., memory_at=<chunk date>)`.
- chat: L1 raw turn stored, ONE extraction call (Memory Extractor prompt, reply: ```json
  {"memory": [{"content", "tags", "owner"}], "intentions": [...], "basic_info": {}}```), then
  reconcile against similar existing memories (more LLM calls only when candidates exist).
- working / coding: the input must carry a tool-call trace (assistant `tool_calls` + `role=tool`
  turns; coding reads path/old/new edits); facts + experiences, several LLM calls per write.

Malformed output, what hy-memory does by itself: fenced/braced JSON, then `json_repair`; a reply
that json_repair turns into *any* dict is a "success" with zero memories. We capture every chat
reply (harnesses.callcount) and judge the extraction reply ourselves (silent failure malformed-as-platform-error).

Traps: `list_memories` and `memory_stats` both go through `list_by_user(limit=10000)`: a hidden
10,000 cap. `read_all` lifts the cap explicitly (limit = independent count + 1) and `count` asks
Chroma directly, so a capped listing cannot agree with it by accident (silent failure capped-read-all).

Canonical entry text (size_tokens): chat: the node's `content` for ACTIVE non-raw nodes (the raw
L1 conversation is not the writer's output); working/coding: experience `task\\nsolution` and
active fact `statement`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.metadata
import json
import logging
import os
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
    WriteResult,
    WriteStatus,
    checked_read_all,
    config_hash,
    open_or_create_bank_dir,
    validate_messages,
)
from harnesses.callcount import COUNTER

log = logging.getLogger(__name__)

POLICY_ERROR_CODES = {"JSON_PARSE_FAILED", "EMPTY_RESPONSE"}  # hy-memory's own "the LLM output was bad"


@dataclasses.dataclass
class HyMemoryOptions:
    user_id: str = "user"  # first-level isolation key; one bank = one user
    agent_id: str = "default_agent"  # second-level key
    workspace_id: str = "workspace"  # working/coding: repository / project key
    embedding_dims: int = 384  # MiniLM-L6 width served by the gateway's /v1/embeddings
    temperature: float = 1.0  # hy-memory's default 0.1 would not be on-policy sampling
    mode: str = "pro"  # lite stores raw only (no policy), ultra needs a graph store
    # response budget of each of its LLM calls (MEMORY_AGENT_MAX_TOKENS; hy-memory's default 2000;
    # the report's response budget is 4,096)
    agent_max_tokens: int = 4096


def _unfence(text: str) -> str:
    """hy-memory's own fence handling (agent/extractor.py `_parse_json`)."""
    text = text.strip()
    if "```json" in text:
        return text.split("```json")[1].split("```")[0].strip()
    if "```" in text:
        return text.split("```")[1].split("```")[0].strip()
    return text


def _nonempty(x: Any) -> bool:
    return isinstance(x, str) and bool(x.strip())


def classify_reply(reply: str | None, scene: str) -> tuple[bool, bool, int]:
    """(well_formed, repaired, num_items) of a raw extraction reply. Pure function.

    chat: well-formed = a JSON object (fences are the requested format, not a repair) whose
    "memory" is a list of {"content": non-empty str}. working/coding: "experiences" is a list of
    {"task", "solution"} and "fact" is {"statement"} or null.
    repaired = only json_repair could read it (what hy-memory falls back to).
    """
    if not reply or not reply.strip():
        return False, False, 0
    text, repaired = _unfence(reply), False
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        repaired = True
        try:
            from json_repair import repair_json  # hy-memory venv only

            obj = repair_json(text, return_objects=True)
        except Exception:
            return False, True, 0
    if not isinstance(obj, dict) or not obj:
        return False, repaired, 0
    if scene != "chat":
        # working/coding extraction: {"experiences": [{task, solution, ...}], "fact": {statement, files} | null}
        exps, fact = obj.get("experiences"), obj.get("fact")
        if not isinstance(exps, list) or not (fact is None or isinstance(fact, dict)):
            return False, repaired, 0
        good = [
            e
            for e in exps
            if isinstance(e, dict) and _nonempty(e.get("task")) and _nonempty(e.get("solution"))
        ]
        fact_ok = fact is None or _nonempty(fact.get("statement"))
        return len(good) == len(exps) and fact_ok, repaired, len(good) + (fact is not None)
    items = obj.get("memory")
    if not isinstance(items, list):
        return False, repaired, 0
    good = [
        m for m in items if isinstance(m, dict) and isinstance(m.get("content"), str) and m["content"].strip()
    ]
    return len(good) == len(items), repaired, len(good)


class HyMemoryHarness(Harness):
    framework = "hy_memory"

    def __init__(self, llm: Endpoint | None, embedder: Endpoint | None, *, scene: str = "chat", options=None):
        if scene not in ("chat", "working", "coding"):
            raise ConfigurationError(f"hy_memory harness: unknown scene {scene!r} (chat | working | coding)")
        try:
            self.opts = HyMemoryOptions(**(options or {}))
        except TypeError as e:
            raise ConfigurationError(f"harness.options for hy_memory: {e}") from None
        if self.opts.mode != "pro":
            raise ConfigurationError(
                f"harness.options.mode={self.opts.mode!r}: only 'pro' is supported offline"
            )
        if embedder is None:
            raise ConfigurationError(
                "hy_memory harness needs an embedding endpoint (the gateway's /v1/embeddings)"
            )
        self.llm, self.embedder, self.scene = llm, embedder, scene
        self.framework_version = importlib.metadata.version("hy-memory")
        self._client = None
        self._lock: BankLock | None = None
        self._meta: BankMetadata | None = None
        self._bank_dir: Path | None = None

    def _expected_meta(self) -> BankMetadata:
        behaviour = {k: v for k, v in dataclasses.asdict(self.opts).items() if k != "temperature"}
        behaviour["embedder_model"] = self.embedder.model
        return BankMetadata(
            framework=self.framework,
            framework_version=self.framework_version,
            scene=self.scene,
            config_hash=config_hash(behaviour),
            bank_id="",
        )

    def _env(self, bank_dir: Path) -> dict[str, str]:
        llm = self.llm or Endpoint("http://127.0.0.1:9/v1", "no-llm", "none")  # read-only use: never called
        return {
            "MEMORY_DATA_DIR": str(bank_dir / "data"),
            # logs and traces outside the bank: they would make forks bigger and banks differ by timing
            "MEMORY_LOG_DIR": str(Path.home() / "hy_memory_logs"),
            "MEMORY_TRACE_LOG_DIR": str(Path.home() / "hy_memory_logs"),
            "MEMORY_PIPELINE_TRACE_ENABLED": "false",
            "MEMORY_MODE": self.opts.mode,
            "MEMORY_VECTOR_STORE": "chroma",
            "MEMORY_LLM_PROVIDER": "openai",
            "MEMORY_LLM_BASE_URL": llm.base_url,
            "MEMORY_LLM_API_KEY": llm.api_key,
            "MEMORY_LLM_MODEL": llm.model,
            "MEMORY_LLM_TEMPERATURE": str(self.opts.temperature),
            "MEMORY_AGENT_MAX_TOKENS": str(self.opts.agent_max_tokens),
            "MEMORY_LLM_TIMEOUT": str(int(llm.timeout_s)),
            # one attempt: platform retries are the sandbox client's (bank restored first), and a
            # hidden framework retry would add segments the gateway cannot attribute
            "MEMORY_LLM_MAX_RETRIES": "1",
            "MEMORY_EMBEDDER_PROVIDER": "openai",
            "MEMORY_EMBEDDER_BASE_URL": self.embedder.base_url,
            "MEMORY_EMBEDDER_API_KEY": self.embedder.api_key,
            "MEMORY_EMBEDDER_MODEL": self.embedder.model,
            "MEMORY_EMBEDDING_DIMS": str(self.opts.embedding_dims),
            "MEMORY_ENABLE_GRAPH": "false",
            "ANONYMIZED_TELEMETRY": "False",
        }

    # ---- lifecycle
    def open(self, bank_dir, *, create: bool = False) -> BankMetadata:
        if self._client is not None:
            raise BankStateError(f"{self._bank_dir}: this harness already has a bank open")
        bank_dir = Path(bank_dir)
        expected = self._expected_meta()
        meta, _ = open_or_create_bank_dir(bank_dir, expected, create)
        lock = BankLock(bank_dir)
        lock.acquire()
        try:
            os.environ.update(self._env(bank_dir))  # hy-memory reads its whole config from the environment
            from hy_memory import HyMemoryClient

            self._client = HyMemoryClient(mode=self.opts.mode)
        except BaseException:
            lock.release()
            raise
        self._lock, self._meta, self._bank_dir = lock, meta, bank_dir
        return meta

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            try:
                client.close()
            finally:
                # Chroma caches one System per path in-process; drop it so that a bank directory
                # replaced on disk (restore, fork) is re-read, not served from stale handles
                from chromadb.api.client import SharedSystemClient  # hy-memory venv only

                SharedSystemClient.clear_system_cache()
        self._release_bank()

    def _need(self):
        if self._client is None:
            raise BankStateError("hy_memory harness: no bank open")
        return self._client

    # ---- reads
    def _coding_db(self) -> Path:
        assert self._bank_dir is not None
        name = "coding_memory_cv.db" if self.scene == "coding" else "coding_memory.db"
        return self._bank_dir / "data" / "data" / name

    def _chat_where(self) -> dict[str, Any]:
        return {
            "$and": [
                {"user_id": {"$eq": self.opts.user_id}},
                {"layer": {"$ne": "l1_raw"}},
                {"status": {"$eq": "active"}},
            ]
        }

    def count(self) -> int:
        client = self._need()
        if self.scene == "chat":
            # straight to Chroma, no limit: independent of hy-memory's capped listing
            coll = client._vector_store._collection
            return len(coll.get(where=self._chat_where(), include=[])["ids"])
        db = self._coding_db()
        if not db.exists():
            return 0
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            (n_exp,) = con.execute(
                "SELECT COUNT(*) FROM coding_memory_meta WHERE user_id=?", (self.opts.user_id,)
            ).fetchone()
            (n_fact,) = con.execute(
                "SELECT COUNT(*) FROM working_fact WHERE user_id=? AND status='active'", (self.opts.user_id,)
            ).fetchone()
        return n_exp + n_fact

    def read_all(self) -> list[MemoryEntry]:
        client = self._need()
        n = self.count()
        if self.scene == "chat":
            from hy_memory.models.memory import MemoryStatus

            vs = client._vector_store
            # the framework's own listing, with its hidden 10,000 default lifted explicitly
            nodes = client._loop_thread.run(
                vs.list_by_user(
                    user_id=self.opts.user_id,
                    limit=max(n + 1, 1),
                    status_filter=[MemoryStatus.ACTIVE],
                    with_vectors=False,
                )
            )
            entries = [
                MemoryEntry(
                    id=nd.node_id,
                    text=nd.content,
                    metadata={
                        "layer": getattr(nd.layer, "value", str(nd.layer)),
                        "session_id": nd.session_id,
                        "memory_at": nd.memory_at.isoformat() if nd.memory_at else None,
                    },
                )
                for nd in nodes
            ]
            return checked_read_all(entries, n, f"hy_memory chat bank {self._bank_dir}")
        db = self._coding_db()
        entries = []
        if db.exists():
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                for eid, task, sol, sess in con.execute(
                    "SELECT experience_id, task, solution, session_id FROM coding_memory_meta WHERE user_id=? "
                    "ORDER BY created_at",
                    (self.opts.user_id,),
                ):
                    entries.append(
                        MemoryEntry(eid, f"{task}\n{sol}", {"kind": "experience", "session_id": sess})
                    )
                for fid, stmt, sess in con.execute(
                    "SELECT fact_id, statement, session_id FROM working_fact WHERE user_id=? AND status='active' "
                    "ORDER BY created_at",
                    (self.opts.user_id,),
                ):
                    entries.append(MemoryEntry(fid, stmt, {"kind": "fact", "session_id": sess}))
        return checked_read_all(entries, n, f"hy_memory {self.scene} bank {self._bank_dir}")

    def search(self, query: str, k: int) -> list[MemoryEntry]:
        client = self._need()
        kw: dict[str, Any] = {"user_ids": [self.opts.user_id], "limit": k, "scene": self.scene}
        if self.scene != "chat":
            kw["workspace_id"] = self.opts.workspace_id
        res = client.search(query, **kw)
        out: list[MemoryEntry] = []
        if self.scene == "chat":
            mems = res.get("memories", {})
            for channel in ("normal", "profile", "proactive"):
                for m in mems.get(channel, []) or []:
                    out.append(
                        MemoryEntry(
                            str(m.get("memory_id", "")),
                            m.get("content", ""),
                            {"channel": channel},
                            m.get("score"),
                        )
                    )
        else:
            for m in res.get("facts", []) or []:
                out.append(
                    MemoryEntry(
                        str(m.get("fact_id", "")), m.get("statement", ""), {"kind": "fact"}, m.get("score")
                    )
                )
            for m in res.get("experiences", []) or []:
                text = f"{m.get('task', '')}\n{m.get('solution', '')}"
                out.append(
                    MemoryEntry(str(m.get("experience_id", "")), text, {"kind": "experience"}, m.get("score"))
                )
        out.sort(key=lambda e: -(e.score or 0.0))
        return out[:k]

    # ---- write path
    def write_chunk(self, messages, session_id, date, *, chunk_index=None) -> WriteResult:
        client = self._need()
        validate_messages(messages)
        if self.llm is None:
            raise BankStateError("hy_memory harness: opened without an LLM endpoint, cannot write")
        memory_at = dt.datetime.fromisoformat(date)  # a bad date is a caller bug: raise
        n_before = self.count()
        COUNTER.replies.clear()
        calls0, timeouts0 = COUNTER.num_chat_calls, COUNTER.num_chat_timeouts
        COUNTER.chunk_index = chunk_index
        error: BaseException | None = None
        res: dict[str, Any] = {}
        kw: dict[str, Any] = {}
        if self.scene != "chat":
            kw["workspace_id"] = self.opts.workspace_id
        try:
            res = client.add(
                messages,
                user_id=self.opts.user_id,
                agent_id=self.opts.agent_id,
                session_id=session_id,
                memory_at=memory_at,
                scene=self.scene,
                **kw,
            )
        except Exception as e:  # classified below
            error = e
        finally:
            COUNTER.chunk_index = None
        n_calls = COUNTER.num_chat_calls - calls0
        replies = list(COUNTER.replies)
        code = res.get("agent_error_code") or res.get("error_code")
        if not replies:
            detail = error or res.get("error_message") or "no LLM reply"
            if self.scene != "chat" and error is None and res.get("success") is True:
                # e.g. a working/coding write without a tool trace is routed to zero-LLM storage
                return WriteResult(WriteStatus.OK, n_calls, f"no LLM call made: {str(res)[:200]}")
            return WriteResult(
                WriteStatus.PLATFORM_ERROR,
                n_calls,
                f"hy_memory add failed before a reply: {detail!r:.300}",
                writer_timeout=COUNTER.num_chat_timeouts > timeouts0,  # the writer's endpoint never answered
            )
        well_formed, repaired, _ = classify_reply(replies[0], self.scene)
        if code in POLICY_ERROR_CODES or not well_formed:
            return WriteResult(
                WriteStatus.POLICY_ERROR,
                n_calls,
                f"malformed extraction reply ({code}): {str(replies[0])[:160]!r}",
            )
        if error is not None or res.get("success") is not True:
            return WriteResult(
                WriteStatus.PLATFORM_ERROR,
                n_calls,
                f"hy_memory add failed: {error or res.get('error_message')!r:.300}",
            )
        changes = self._num_changes(res, n_before)
        if repaired and changes == 0:
            return WriteResult(
                WriteStatus.POLICY_ERROR,
                n_calls,
                "zero memories from repaired JSON (silent failure malformed-as-platform-error)",
            )
        ops = res.get("ops_summary") or {}
        return WriteResult(
            WriteStatus.OK,
            n_calls,
            None,
            num_added=int(ops.get("add", max(self.count() - n_before, 0))),
            num_updated=int(ops.get("update", 0)) + int(ops.get("supersede", 0)),
        )

    def _num_changes(self, res: dict[str, Any], n_before: int) -> int:
        ops = res.get("ops_summary")
        if isinstance(ops, dict) and "total" in ops:
            return int(ops["total"])
        return len(res.get("ops") or []) + len(res.get("fact_ops") or []) or abs(self.count() - n_before)
