"""Mem0 (PyPI `mem0ai` 2.2.1) as a harness. Imported only inside the `.venvs/mem0` sandbox.

Write path (mem0/memory/main.py `Memory.add` -> `_add_to_vector_store`, the "V3 phased batch
pipeline"): embed the chunk, fetch the top-10 existing memories, ONE LLM call with
ADDITIVE_EXTRACTION_PROMPT (~34 KB system prompt) expecting `{"memory": [{"id", "text", ...}]}`,
then batch-embed the new texts, hash-dedup, insert into Qdrant, write history (SQLite), entity
linking (no-op without spaCy). ADD-only: mem0 2.x never updates or deletes on `add`.

What mem0 itself does with bad output (why we classify it ourselves, silent failure malformed-as-platform-error):
a reply that does not parse, or parses only after `extract_json` repair, or has no "memory" key,
makes `add` return `[]`, exactly like "nothing worth storing". We therefore capture the raw reply
and re-check it with mem0's own parsing steps; malformed -> POLICY_ERROR, clean empty -> OK.

Traps handled here:
- `Memory.get_all(top_k=20)` by default, and Qdrant `scroll` pages: `read_all` scrolls every page
  of the collection and checks the total against Qdrant's exact `count` (silent failure capped-read-all).
- The chunk's date: mem0 stamps "Current Date"/"Observation Date" with *today*; we pass the
  chunk's date into its own prompt builder (`current_date=`), the only change to its write path.
- Offline: MEM0_TELEMETRY=False (set by the sandbox) also disables the remote "notices" fetch;
  no spaCy / fastembed in the venv, so no model download (BM25 hybrid and entity linking off).

Bank layout: `qdrant/` (local Qdrant, collection `mem0` + `mem0_entities`), `history.db`.
Canonical entry text (size_tokens): the memory's `data` payload (what mem0 calls `memory`).
"""

from __future__ import annotations

import dataclasses
import functools
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

COLLECTION = "mem0"
SCROLL_PAGE = 256  # read_all page size; any value works, the loop follows next_page_offset


@dataclasses.dataclass
class Mem0Options:
    user_id: str = "user"  # mem0 scopes every memory by an entity id; one bank = one user
    embedding_dims: int = 384  # MiniLM-L6 width served by the gateway's /v1/embeddings
    temperature: float = 1.0  # mem0 defaults to 0.1; on-policy rollouts sample at the policy's temperature
    top_p: float = 1.0  # mem0 defaults to 0.1 (same reason)
    max_tokens: int = 2000  # mem0's default response budget


def classify_reply(reply: Any) -> tuple[bool, bool, int]:
    """(well_formed, repaired, num_memories) of a raw mem0 extraction reply, by mem0's own steps.

    Pure function. well_formed: a JSON object whose "memory" is a list of {"text": non-empty str}.
    """
    from mem0.memory.utils import extract_json, remove_code_blocks

    text = remove_code_blocks(reply) if reply is not None else ""
    if not text.strip():
        return False, False, 0
    repaired = False
    try:
        obj = json.loads(text, strict=False)
    except json.JSONDecodeError:
        try:
            obj, repaired = json.loads(extract_json(text), strict=False), True
        except json.JSONDecodeError:
            return False, False, 0
    if not isinstance(obj, dict) or not isinstance(obj.get("memory"), list):
        return False, repaired, 0
    items = obj["memory"]
    ok_items = [
        m for m in items if isinstance(m, dict) and isinstance(m.get("text"), str) and m["text"].strip()
    ]
    return len(ok_items) == len(items), repaired, len(ok_items)


class Mem0Harness(Harness):
    framework = "mem0"

    def __init__(
        self, llm: Endpoint | None, embedder: Endpoint | None, *, scene: str = "default", options=None
    ):
        if scene != "default":
            raise ConfigurationError(f"mem0 harness: unknown scene {scene!r} (only 'default')")
        try:
            self.opts = Mem0Options(**(options or {}))
        except TypeError as e:
            raise ConfigurationError(f"harness.options for mem0: {e}") from None
        if embedder is None:
            raise ConfigurationError(
                "mem0 harness needs an embedding endpoint (the gateway's /v1/embeddings)"
            )
        self.llm, self.embedder, self.scene = llm, embedder, scene
        self.framework_version = importlib.metadata.version("mem0ai")
        self._mem = None
        self._lock: BankLock | None = None
        self._meta: BankMetadata | None = None
        self._bank_dir: Path | None = None
        self._replies: list[Any] = []

    def _expected_meta(self) -> BankMetadata:
        behaviour = {
            k: v for k, v in dataclasses.asdict(self.opts).items() if k not in ("temperature", "top_p")
        }
        behaviour["embedder_model"] = self.embedder.model  # vectors from another embedder are not comparable
        return BankMetadata(
            framework=self.framework,
            framework_version=self.framework_version,
            scene=self.scene,
            config_hash=config_hash(behaviour),
            bank_id="",
        )

    def _mem0_config(self, bank_dir: Path) -> dict[str, Any]:
        llm = self.llm or Endpoint("http://127.0.0.1:9/v1", "no-llm", "none")  # read-only use: never called
        return {
            "vector_store": {
                "provider": "qdrant",
                "config": {
                    "collection_name": COLLECTION,
                    "path": str(bank_dir / "qdrant"),
                    "embedding_model_dims": self.opts.embedding_dims,
                    "on_disk": True,
                },
            },
            "llm": {
                "provider": "openai",
                "config": {
                    "model": llm.model,
                    "api_key": llm.api_key,
                    "openai_base_url": llm.base_url,
                    "temperature": self.opts.temperature,
                    "top_p": self.opts.top_p,
                    "max_tokens": self.opts.max_tokens,
                },
            },
            "embedder": {
                "provider": "openai",
                "config": {
                    "model": self.embedder.model,
                    "api_key": self.embedder.api_key,
                    "openai_base_url": self.embedder.base_url,
                    "embedding_dims": self.opts.embedding_dims,
                },
            },
            "history_db_path": str(bank_dir / "history.db"),
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
            import mem0.memory.main as mem0_main
            import mem0.memory.notices as notices
            from mem0 import Memory

            notices._fetch_remote_config = lambda: None  # belt and braces: never reach github
            mem = Memory.from_config(self._mem0_config(bank_dir))
            if self.llm is not None:  # mem0 builds its OpenAI client without one: the endpoint's own timeout
                mem.llm.client = mem.llm.client.with_options(timeout=self.llm.timeout_s)
            orig = mem.llm.generate_response

            @functools.wraps(orig)
            def capture(*args, **kwargs):
                out = orig(*args, **kwargs)
                self._replies.append(out)
                return out

            mem.llm.generate_response = capture
            self._prompt_builder = mem0_main.generate_additive_extraction_prompt
        except BaseException:
            lock.release()
            raise
        self._mem, self._lock, self._meta, self._bank_dir = mem, lock, meta, bank_dir
        return meta

    def close(self) -> None:
        if self._mem is not None:
            mem, self._mem = self._mem, None
            try:
                mem.close()  # history SQLite
            finally:
                mem.vector_store.client.close()  # local Qdrant: releases its portalocker .lock
        self._release_bank()

    def _need(self):
        if self._mem is None:
            raise BankStateError("mem0 harness: no bank open")
        return self._mem

    # ---- reads
    def count(self) -> int:
        return self._need().vector_store.client.count(COLLECTION, exact=True).count

    def read_all(self) -> list[MemoryEntry]:
        client = self._need().vector_store.client
        entries: list[MemoryEntry] = []
        offset = None
        while True:
            points, offset = client.scroll(
                COLLECTION, limit=SCROLL_PAGE, offset=offset, with_payload=True, with_vectors=False
            )
            for p in points:
                payload = dict(p.payload or {})
                text = payload.pop("data", "")
                payload.pop("text_lemmatized", None)
                entries.append(MemoryEntry(id=str(p.id), text=text, metadata=payload))
            if offset is None:
                break
        return checked_read_all(entries, self.count(), f"mem0 bank {self._bank_dir}")

    def search(self, query: str, k: int) -> list[MemoryEntry]:
        res = self._need().search(query, filters={"user_id": self.opts.user_id}, top_k=k)
        return [
            MemoryEntry(id=str(r["id"]), text=r["memory"], metadata={}, score=r.get("score"))
            for r in res.get("results", [])
        ]

    # ---- write path
    def write_chunk(self, messages, session_id, date, *, chunk_index=None) -> WriteResult:
        mem = self._need()
        validate_messages(messages)
        if self.llm is None:
            raise BankStateError("mem0 harness: opened without an LLM endpoint, cannot write")
        import mem0.memory.main as mem0_main

        self._replies.clear()
        calls0, timeouts0 = COUNTER.num_chat_calls, COUNTER.num_chat_timeouts
        COUNTER.chunk_index = chunk_index
        # the chunk's date, not today's, in mem0's own prompt builder (see module docstring)
        mem0_main.generate_additive_extraction_prompt = functools.partial(
            self._prompt_builder, current_date=date
        )
        error: BaseException | None = None
        try:
            out = mem.add(
                [{"role": m["role"], "content": m["content"]} for m in messages],
                user_id=self.opts.user_id,
                metadata={"session_id": session_id, "date": date},
            )
        except Exception as e:  # classified below: policy or platform
            error, out = e, None
        finally:
            mem0_main.generate_additive_extraction_prompt = self._prompt_builder
            COUNTER.chunk_index = None
        n_calls = COUNTER.num_chat_calls - calls0
        if not self._replies:
            # the LLM never answered (HTTP error, timeout, identity refused) or mem0 failed before asking
            return WriteResult(
                WriteStatus.PLATFORM_ERROR,
                n_calls,
                f"mem0 add failed before a reply: {error!r:.300}",
                writer_timeout=COUNTER.num_chat_timeouts > timeouts0,  # the writer's endpoint never answered
            )
        well_formed, repaired, n_mem = classify_reply(self._replies[-1])
        if not well_formed:
            return WriteResult(
                WriteStatus.POLICY_ERROR,
                n_calls,
                f"malformed mem0 extraction reply: {str(self._replies[-1])[:160]!r}",
            )
        if error is not None:
            # well-formed output and mem0 still raised: the store / embedder / framework failed
            return WriteResult(WriteStatus.PLATFORM_ERROR, n_calls, f"mem0 add raised: {error!r:.300}")
        added = [r for r in (out or {}).get("results", []) if r.get("event") == "ADD"]
        if repaired and not added:
            return WriteResult(
                WriteStatus.POLICY_ERROR,
                n_calls,
                "zero memories from repaired JSON (silent failure malformed-as-platform-error)",
            )
        return WriteResult(WriteStatus.OK, n_calls, None, num_added=len(added))
