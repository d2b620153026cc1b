"""MemoryOS / MemOS (PyPI `MemoryOS` 2.0.33, package `memos`) as a harness, `general_text` memory.

Imported only inside the `.venvs/memoryos` sandbox (MemOS pins transformers<5 and openai<2, which
is why harnesses run in their own venvs). The `tree_text` backend needs a Neo4j graph server, so
the issue asks for `general_text` over local Qdrant.

Write path (memos/memories/textual/general.py): `GeneralTextMemory.extract(messages)`: ONE LLM
call with SIMPLE_STRUCT_MEM_READER_PROMPT, reply `{"memory list": [{"key", "memory_type",
"value", "tags"}], "summary"}`; then `add(items)`: embed every value, insert into Qdrant.
ADD-only, no dedup, no update.

Malformed output, what MemOS does by itself: `parse_json_result` cuts from the first "{",
strips fences, appends a missing "}", and returns `{}` on a decode error; extract then raises
KeyError('memory list') (or IndexError on an empty reply). Its tenacity retry only fires on
JSONDecodeError, which parse_json_result swallows, so there is exactly one call. We judge the
captured reply ourselves: malformed -> POLICY_ERROR; a crash after a well-formed reply ->
PLATFORM_ERROR (silent failures platform-error-as-reward and malformed-as-platform-error).

Date: general_text's prompt has no date slot; the chunk date goes in as a first `system:` line
of the conversation text (the only place its prompt carries the conversation).

Bank layout: `qdrant/` (local Qdrant, collection `memos`). `get_all` pages with scroll (no cap);
`count` is Qdrant's exact count. Canonical entry text: the item's `memory` (the reply's `value`).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
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

COLLECTION = "memos"


@dataclasses.dataclass
class MemosOptions:
    embedding_dims: int = 384  # MiniLM-L6 width served by the gateway's /v1/embeddings
    temperature: float = 1.0  # MemOS default 0.7; on-policy sampling
    top_p: float = 1.0  # MemOS default 0.95
    max_tokens: int = 4096  # MemOS default 8192 (the report's response budget is 4,096)


def classify_reply(reply: str | None) -> tuple[bool, bool, int]:
    """(well_formed, repaired, num_items) by MemOS's own parsing steps. Pure function.

    well-formed: a JSON object whose "memory list" holds {"key": str, "value": non-empty str,
    "tags": list}. repaired: parseable only after MemOS's "append a missing }" fix.
    """
    if not reply or "{" not in reply:
        return False, False, 0
    text = reply[reply.find("{") :].replace("```", "").strip()
    repaired = False
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        try:
            obj, repaired = json.loads(text + "}"), True
        except json.JSONDecodeError:
            return False, False, 0
    items = obj.get("memory list") if isinstance(obj, dict) else None
    if not isinstance(items, list):
        return False, repaired, 0
    good = [
        m
        for m in items
        if isinstance(m, dict)
        and isinstance(m.get("key"), str)
        and isinstance(m.get("value"), str)
        and m["value"].strip()
        and isinstance(m.get("tags"), list)
    ]
    return len(good) == len(items), repaired, len(good)


class MemosHarness(Harness):
    framework = "memoryos"

    def __init__(
        self, llm: Endpoint | None, embedder: Endpoint | None, *, scene: str = "general_text", options=None
    ):
        if scene != "general_text":
            raise ConfigurationError(
                f"memoryos harness: unknown scene {scene!r} (only 'general_text'; tree_text needs a graph server)"
            )
        try:
            self.opts = MemosOptions(**(options or {}))
        except TypeError as e:
            raise ConfigurationError(f"harness.options for memoryos: {e}") from None
        if embedder is None:
            raise ConfigurationError(
                "memoryos harness needs an embedding endpoint (the gateway's /v1/embeddings)"
            )
        self.llm, self.embedder, self.scene = llm, embedder, scene
        self.framework_version = importlib.metadata.version("MemoryOS")
        self._mem = None
        self._lock: BankLock | None = None
        self._meta: BankMetadata | None = None
        self._bank_dir: Path | None = None

    def _expected_meta(self) -> BankMetadata:
        behaviour = {"embedding_dims": self.opts.embedding_dims, "embedder_model": self.embedder.model}
        return BankMetadata(
            framework=self.framework,
            framework_version=self.framework_version,
            scene=self.scene,
            config_hash=config_hash(behaviour),
            bank_id="",
        )

    def _config(self, bank_dir: Path) -> dict[str, Any]:
        llm = self.llm or Endpoint("http://127.0.0.1:9/v1", "no-llm", "none")  # read-only use: never called
        return {
            "extractor_llm": {
                "backend": "openai",
                "config": {
                    "model_name_or_path": llm.model,
                    "api_key": llm.api_key,
                    "api_base": llm.base_url,
                    "temperature": self.opts.temperature,
                    "top_p": self.opts.top_p,
                    "max_tokens": self.opts.max_tokens,
                },
            },
            "vector_db": {
                "backend": "qdrant",
                "config": {
                    "collection_name": COLLECTION,
                    "vector_dimension": self.opts.embedding_dims,
                    "distance_metric": "cosine",
                    "path": str(bank_dir / "qdrant"),
                },
            },
            "embedder": {
                "backend": "universal_api",
                "config": {
                    "provider": "openai",
                    "api_key": self.embedder.api_key,
                    "base_url": self.embedder.base_url,
                    "model_name_or_path": self.embedder.model,
                },
            },
        }

    # ---- lifecycle
    def open(self, bank_dir, *, create: bool = False) -> BankMetadata:
        if self._mem is not None:
            raise BankStateError(f"{self._bank_dir}: this harness already has a bank open")
        bank_dir = Path(bank_dir)
        expected = self._expected_meta()
        meta, _ = open_or_create_bank_dir(bank_dir, expected, create)
        lock = BankLock(bank_dir)
        lock.acquire()
        try:
            from memos.configs.memory import GeneralTextMemoryConfig
            from memos.memories.textual.general import GeneralTextMemory

            self._mem = GeneralTextMemory(GeneralTextMemoryConfig(**self._config(bank_dir)))
        except BaseException:
            lock.release()
            raise
        self._lock, self._meta, self._bank_dir = lock, meta, bank_dir
        return meta

    def close(self) -> None:
        if self._mem is not None:
            mem, self._mem = self._mem, None
            mem.vector_db.client.close()  # local Qdrant: releases its .lock
        self._release_bank()

    def _need(self):
        if self._mem is None:
            raise BankStateError("memoryos harness: no bank open")
        return self._mem

    # ---- reads
    def count(self) -> int:
        return self._need().vector_db.client.count(COLLECTION, exact=True).count

    def read_all(self) -> list[MemoryEntry]:
        items = self._need().get_all()  # scroll-paginated by MemOS itself (checked below)
        entries = [
            MemoryEntry(
                id=str(it.id),
                text=it.memory,
                metadata={
                    "key": getattr(it.metadata, "key", None),
                    "tags": getattr(it.metadata, "tags", None),
                },
            )
            for it in items
        ]
        return checked_read_all(entries, self.count(), f"memoryos bank {self._bank_dir}")

    def search(self, query: str, k: int) -> list[MemoryEntry]:
        return [MemoryEntry(str(it.id), it.memory, {}) for it in self._need().search(query, k)]

    # ---- write path
    def write_chunk(self, messages, session_id, date, *, chunk_index=None) -> WriteResult:
        mem = self._need()
        validate_messages(messages)
        if self.llm is None:
            raise BankStateError("memoryos harness: opened without an LLM endpoint, cannot write")
        convo = [{"role": "system", "content": f"session {session_id}, date {date}"}] + [
            {"role": str(m["role"]), "content": str(m["content"] or "")} for m in messages
        ]
        COUNTER.replies.clear()
        calls0 = COUNTER.num_chat_calls
        COUNTER.chunk_index = chunk_index
        error: BaseException | None = None
        n_added = 0
        try:
            items = mem.extract(convo)
            if items:
                mem.add(items)
            n_added = len(items)
        except Exception as e:  # classified below
            error = e
        finally:
            COUNTER.chunk_index = None
        n_calls = COUNTER.num_chat_calls - calls0
        if not COUNTER.replies:
            return WriteResult(
                WriteStatus.PLATFORM_ERROR, n_calls, f"memoryos write failed before a reply: {error!r:.300}"
            )
        well_formed, repaired, _ = classify_reply(COUNTER.replies[0])
        if not well_formed:
            return WriteResult(
                WriteStatus.POLICY_ERROR,
                n_calls,
                f"malformed MemOS extraction reply: {str(COUNTER.replies[0])[:160]!r}",
            )
        if error is not None:
            return WriteResult(WriteStatus.PLATFORM_ERROR, n_calls, f"memoryos write raised: {error!r:.300}")
        if repaired and n_added == 0:
            return WriteResult(
                WriteStatus.POLICY_ERROR,
                n_calls,
                "zero memories from repaired JSON (silent failure malformed-as-platform-error)",
            )
        return WriteResult(WriteStatus.OK, n_calls, None, num_added=n_added)
