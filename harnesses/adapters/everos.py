"""EverOS (PyPI `EverOS` 1.5.1, Python >= 3.12) as a harness: held out, evaluation only.

Imported only inside the `.venvs/everos` sandbox. EverOS is a FastAPI service; we run its own
`create_app()` in-process under `fastapi.testclient.TestClient` (the app's lifespan starts its
SQLite, LanceDB, cascade indexer and OME strategy engine) and call its public routes, so the
write path is the framework's own, unchanged.

Write path per chunk (everos/service/memorize.py, everos/entrypoints/api/routes/memorize.py):
`POST /api/v2/memory/add` with `defer_extraction=true` (the batch goes to the session buffer),
then `POST /api/v2/memory/flush` (one chunk = one batch, EverOS's documented batching mode):
1. boundary detection: ONE call, reply `{"boundaries": [int], "should_wait": bool}`
   (everalgo/boundary/chat.py `_call_llm_for_batch_boundary`; everos/service/_boundary.py retries
   a ValueError 3 times in all, then raises);
2. per memcell, episode extraction: reply `{"title", "content", "summary"}`
   (everalgo/user_memory/episode.py; retried on ValueError, 3 attempts,
   everos/memory/extract/pipeline/user_memory.py `_extract_with_retry`);
3. OME strategies on the emitted events, run by the engine in the background:
   atomic facts from each episode, reply `{"atomic_facts": {"time", "atomic_fact": [str]}}`
   (everalgo/user_memory/atomic_fact.py), plus foresight / profile when their triggers fire;
   a failing run is retried by OME and ends in DEAD_LETTER (never raised to the caller);
4. the cascade indexer copies the Markdown entries into LanceDB (asynchronous; we drain it).
We wait for the OME engine to go idle (`OfflineEngine.wait_idle`) and drain the cascade
(`CascadeOrchestrator.drain_fully`) before returning, so every call of the write is counted in
this chunk and the bank is complete when write_chunk returns.

Malformed output: EverOS's parsers cut the first JSON object out of the reply (regex for the
boundary reply, brace balancing for the others) and raise ValueError when it is missing or lacks
the schema keys. We classify with the framework's own verdict: a ValueError raised by an everalgo
parser (in the flush, or as an OME run's dead letter) -> POLICY_ERROR; an LLM transport error
(`everalgo.llm.errors.LLMError`: HTTP error, timeout, 401/403), any other exception, or an OME
run that dies of anything else -> PLATFORM_ERROR (silent failures platform-error-as-reward and malformed-as-platform-error). A write whose
replies needed EverOS's JSON cut-out (text around the object) and stored nothing -> POLICY_ERROR.

Sampling: EverOS sends temperature 0.0 (everalgo LLMConfig default); `[llm].extra` overrides it
to 1.0 / top_p 1.0 / max_tokens 4096 on every call (on-policy sampling).

Date: the chunk date becomes the messages' `timestamp` (epoch ms, the framework's own field),
one second apart. Speakers: user turns carry `sender_id=options.user_id`; EverOS files user
memory under it; system turns go in as user turns with `sender_name="system"`.

Bank layout: `everos/` is EVEROS_ROOT (Markdown entries under `default_app/default_project/
users/<user>/`, SQLite under `.index/sqlite`, LanceDB under `.index/lancedb`, `ome.toml`).
Entries = the active (not `deprecated_by`) rows of the LanceDB tables episode, atomic_fact,
foresight, user_profile, agent_case, agent_skill (every row: `Table.to_arrow()`, no limit; the
public `/memory/get` route caps `page_size` at 100 and lists only episodes/profiles, so it is not
used). count() is LanceDB `count_rows` with the same predicate. Canonical entry text: episode
`episode`, atomic_fact `fact`, foresight `foresight`, user_profile `explicit_info_json` +
`implicit_traits_json`, agent_case `task_intent` + `approach` + `key_insight`, agent_skill
`content`.

Process-global state: EverOS keeps ~20 module singletons bound to the memory root (settings
cache, LLM client, OME engine, writers, SQLite/LanceDB connections). `_reset_everos_globals`
clears them on every open/close, so one sandbox can open bank after bank (tested).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import importlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import sys
import traceback
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
from harnesses.tiktoken_seed import seed_o200k

log = logging.getLogger(__name__)

ROOT_DIR = "everos"  # EVEROS_ROOT inside the bank
API = "/api/v2/memory"
# base URL of the in-process ASGI calls (TestClient -> EverOS app): never leaves the process, so
# the offline proof (callcount's foreign-host counter) must not count it
IN_PROCESS_HOST = "everos-in-process"

# table -> how an entry's canonical text is built from its row
_TEXT_COLUMNS: dict[str, tuple[str, ...]] = {
    "episode": ("episode",),
    "atomic_fact": ("fact",),
    "foresight": ("foresight",),
    "user_profile": ("explicit_info_json", "implicit_traits_json"),
    "agent_case": ("task_intent", "approach", "key_insight"),
    "agent_skill": ("content",),
}
_META_COLUMNS = ("entry_id", "owner_id", "session_id", "timestamp", "subject", "parent_id", "md_path")

# (module, attribute) of every EverOS singleton bound to the memory root or the settings
_GLOBALS = (
    ("everos.service.memorize", "_episode_writer"),
    ("everos.service.memorize", "_prompt_loader"),
    ("everos.service.memorize", "_user_pipeline"),
    ("everos.service.memorize", "_agent_pipeline"),
    ("everos.service.memorize", "_ome_engine"),
    ("everos.service.get", "_manager"),
    ("everos.service.search", "_manager"),
    ("everos.component.llm.client", "_llm_client"),
    ("everos.component.llm.client", "_decider_client"),
    ("everos.component.llm.client", "_multimodal_client"),
    ("everos.component.embedding.accessor", "_capability"),
    ("everos.component.rerank.accessor", "_capability"),
    ("everos.component.multimodal.accessor", "_capability"),
    ("everos.infra.persistence.lancedb.lancedb_manager", "_conn"),
    ("everos.infra.persistence.sqlite.sqlite_manager", "_engine"),
    ("everos.infra.persistence.sqlite.sqlite_manager", "_session_factory"),
    ("everos.memory.strategies.extract_user_profile", "_writer"),
    ("everos.memory.strategies.extract_user_profile", "_reader"),
    ("everos.memory.strategies.extract_foresight", "_writer"),
    ("everos.memory.strategies.reflect_episodes", "_episode_writer"),
    ("everos.memory.strategies.extract_agent_skill", "_writer"),
    ("everos.memory.strategies.extract_agent_skill", "_reader"),
    ("everos.memory.strategies.extract_atomic_facts", "_writer"),
    ("everos.memory.strategies.extract_agent_case", "_writer"),
)

_PARSE_ERROR_RE = re.compile(r"^(ValueError|JSONDecodeError)\b")


@dataclasses.dataclass
class EverOSOptions:
    mode: str = "chat"  # EverOS memorize.mode: chat = user memory only; agent adds agent_case/skill
    user_id: str = "user"  # sender_id of user turns: EverOS files user memory (and search) under it
    embedding_dims: int = 384  # MiniLM-L6 width served by the gateway's /v1/embeddings
    temperature: float = 1.0  # EverOS default 0.0 (everalgo LLMConfig); on-policy sampling
    top_p: float = 1.0  # EverOS sends none
    max_tokens: int = 4096  # EverOS sends none (the report's response budget is 4,096)
    idle_timeout_s: float = 300.0  # wait for the OME strategy runs of one write; longer = platform error
    search_method: str = "hybrid"  # EverOS /memory/search method (keyword | vector | hybrid)


def is_parse_error(exc: BaseException) -> bool:
    """True when EverOS rejected the policy's reply: a ValueError raised while an everalgo parser
    (not its LLM transport) was on the stack. Pure function of the exception and its traceback."""
    from everalgo.llm.errors import LLMError

    if isinstance(exc, LLMError) or not isinstance(exc, ValueError):
        return False
    files = [f.filename for f in traceback.extract_tb(exc.__traceback__)]
    return any("/everalgo/" in f and "/everalgo/llm/" not in f for f in files)


def needed_cutout(reply: str | None) -> bool:
    """True when a reply is JSON only after EverOS cuts the object out of surrounding text
    (its lenient step), i.e. the reply itself is not a JSON object. Pure."""
    if not reply or "{" not in reply:
        return False
    text = reply.strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        return not isinstance(json.loads(text), dict)
    except ValueError:
        return True


def _to_ms(date: str) -> int:
    try:
        d = dt.datetime.fromisoformat(str(date))
    except ValueError:
        raise ValueError(f"write_chunk: date {date!r} is not an ISO date") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.UTC)
    return int(d.timestamp() * 1000)


class EverOSHarness(Harness):
    framework = "everos"

    def __init__(
        self, llm: Endpoint | None, embedder: Endpoint | None, *, scene: str = "default", options=None
    ):
        if scene != "default":
            raise ConfigurationError(f"everos harness: unknown scene {scene!r} (only 'default')")
        try:
            self.opts = EverOSOptions(**(options or {}))
        except TypeError as e:
            raise ConfigurationError(f"harness.options for everos: {e}") from None
        if self.opts.mode not in ("chat", "agent"):
            raise ConfigurationError(f"harness.options.mode for everos: {self.opts.mode!r} (chat | agent)")
        if embedder is None:
            raise ConfigurationError(
                "everos harness needs an embedding endpoint (the gateway's /v1/embeddings)"
            )
        self.llm, self.embedder, self.scene = llm, embedder, scene
        self.framework_version = importlib.metadata.version("EverOS")
        self._client = None  # fastapi TestClient around EverOS's app, entered
        self._app = None
        self._lock: BankLock | None = None
        self._meta: BankMetadata | None = None
        self._bank_dir: Path | None = None
        self._dead_letters: list[Any] = []  # OME RunRecords that exhausted their retries
        self._seed_tiktoken()

    @staticmethod
    def _seed_tiktoken() -> None:
        # EverOS start-up calls tiktoken.get_encoding("o200k_base"), a download; seed its cache
        cache = os.environ.get("TIKTOKEN_CACHE_DIR") or str(Path.home() / ".cache" / "hymem-tiktoken")
        os.environ["TIKTOKEN_CACHE_DIR"] = cache
        seed_o200k(cache)

    def _expected_meta(self) -> BankMetadata:
        behaviour = {
            "mode": self.opts.mode,
            "user_id": self.opts.user_id,
            "embedding_dims": self.opts.embedding_dims,
            "embedder_model": self.embedder.model,
        }
        return BankMetadata(
            framework=self.framework,
            framework_version=self.framework_version,
            scene=self.scene,
            config_hash=config_hash(behaviour),
            bank_id="",
        )

    def _env(self, root: Path) -> dict[str, str]:
        llm = self.llm or Endpoint("http://127.0.0.1:9/v1", "no-llm", "none")  # read-only use: never called
        extra = {
            "temperature": self.opts.temperature,
            "top_p": self.opts.top_p,
            "max_tokens": self.opts.max_tokens,
        }
        return {
            "EVEROS_ROOT": str(root),
            "EVEROS_LLM__MODEL": llm.model,
            "EVEROS_LLM__API_KEY": llm.api_key,
            "EVEROS_LLM__BASE_URL": llm.base_url,
            "EVEROS_LLM__TIMEOUT_SECONDS": str(llm.timeout_s),
            "EVEROS_LLM__EXTRA": json.dumps(extra),
            "EVEROS_EMBEDDING__MODEL": self.embedder.model,
            "EVEROS_EMBEDDING__API_KEY": self.embedder.api_key,
            "EVEROS_EMBEDDING__BASE_URL": self.embedder.base_url,
            "EVEROS_EMBEDDING__DIM": str(self.opts.embedding_dims),
            # no reranker in the loop: point it at the gateway too, so nothing leaves the box
            "EVEROS_RERANK__API_KEY": self.embedder.api_key,
            "EVEROS_RERANK__BASE_URL": self.embedder.base_url,
            "EVEROS_MULTIMODAL__API_KEY": llm.api_key,
            "EVEROS_MULTIMODAL__BASE_URL": llm.base_url,
            "EVEROS_MEMORIZE__MODE": self.opts.mode,
            # inline writes only: the async queue would return 202 before the write happened
            "EVEROS_MEMORIZE__ASYNC_QUEUE__ENABLED": "false",
            "EVEROS_OBSERVABILITY__ENABLED": "false",
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
            self._start(bank_dir / ROOT_DIR)
        except BaseException:
            self._stop()
            lock.release()
            raise
        self._lock, self._meta, self._bank_dir = lock, meta, bank_dir
        return meta

    def _start(self, root: Path) -> None:
        import everos
        from fastapi.testclient import TestClient  # EverOS venv only

        root.mkdir(parents=True, exist_ok=True)
        if not (root / "ome.toml").exists():  # EverOS refuses to start without it
            shutil.copy(Path(everos.__file__).parent / "config" / "default_ome.toml", root / "ome.toml")
        os.environ.update(self._env(root.resolve()))
        _reset_everos_globals()
        from everos.entrypoints.api.app import create_app

        svc = importlib.import_module("everos.service.memorize")
        self._dead_letters = []
        # must be registered before the lifespan starts the engine (engine.py on_dead_letter)
        svc._get_engine().on_dead_letter(self._dead_letters.append)
        self._app = create_app()
        if COUNTER.allowed_netlocs is not None:
            COUNTER.allowed_netlocs.add(IN_PROCESS_HOST)
        # raise_server_exceptions (default): the route's exception reaches us with its traceback
        client = TestClient(self._app, base_url=f"http://{IN_PROCESS_HOST}")
        client.__enter__()
        self._client = client

    def _stop(self) -> None:
        client, self._client = self._client, None
        try:
            if client is not None:
                client.__exit__(None, None, None)  # lifespan shutdown: engine, cascade, stores
        finally:
            self._app = None
            _reset_everos_globals()

    def close(self) -> None:
        try:
            self._stop()
        finally:
            self._release_bank()

    def _need(self):
        if self._client is None:
            raise BankStateError("everos harness: no bank open")
        return self._client

    # ---- reads
    def _tables(self):
        import lancedb  # EverOS venv only

        assert self._bank_dir is not None
        db = lancedb.connect(str(self._bank_dir / ROOT_DIR / ".index" / "lancedb"))
        names = set(db.list_tables().tables)
        for name in _TEXT_COLUMNS:
            if name in names:
                yield name, db.open_table(name)

    @staticmethod
    def _active(table) -> str | None:
        return (
            "deprecated_by IS NULL OR deprecated_by = ''" if "deprecated_by" in table.schema.names else None
        )

    def count(self) -> int:
        self._need()
        return sum(t.count_rows(self._active(t)) for _, t in self._tables())

    def read_all(self) -> list[MemoryEntry]:
        self._need()
        entries = []
        for name, t in self._tables():
            cols = [c for c in t.schema.names if "vector" not in c and not c.endswith("_tokens")]
            rows = t.to_arrow().select(cols).to_pylist()  # every row: no limit
            for r in rows:
                if r.get("deprecated_by"):
                    continue
                text = "\n".join(str(r[c]) for c in _TEXT_COLUMNS[name] if r.get(c))
                meta = {"kind": name, **{k: _plain(r[k]) for k in _META_COLUMNS if k in r}}
                entries.append(MemoryEntry(id=f"{name}:{r['id']}", text=text, metadata=meta))
        return checked_read_all(entries, self.count(), f"everos bank {self._bank_dir}")

    def search(self, query: str, k: int) -> list[MemoryEntry]:
        body = {
            "user_id": self.opts.user_id,
            "query": query,
            "method": self.opts.search_method,
            "top_k": max(1, min(int(k), 100)),
        }
        resp = self._need().post(f"{API}/search", json=body)
        if resp.status_code != 200:
            raise ValueError(f"everos search: HTTP {resp.status_code}: {resp.text[:300]}")
        out = []
        for ep in resp.json()["data"]["episodes"]:
            out.append(
                MemoryEntry(f"episode:{ep['id']}", ep["episode"], {"kind": "episode"}, float(ep["score"]))
            )
            for f in ep.get("atomic_facts") or []:
                out.append(
                    MemoryEntry(
                        f"atomic_fact:{f['id']}", f["content"], {"kind": "atomic_fact"}, float(f["score"])
                    )
                )
        out.sort(key=lambda e: -(e.score or 0.0))
        return out[:k]

    # ---- write path
    def _payload(self, messages, session_id: str, date: str) -> dict[str, Any]:
        t0 = _to_ms(date)
        items = []
        for i, m in enumerate(messages):
            role, content = str(m["role"]), m.get("content")
            item: dict[str, Any] = {"timestamp": t0 + 1000 * i, "content": "" if content is None else content}
            if role == "assistant":
                item.update(role="assistant", sender_id="assistant")
                if m.get("tool_calls"):
                    item["tool_calls"] = m["tool_calls"]
            elif role == "tool":
                item.update(role="tool", sender_id="tool", tool_call_id=m.get("tool_call_id"))
            else:  # user, system: user memory is filed under the user's sender id
                item.update(role="user", sender_id=self.opts.user_id)
                if role != "user":
                    item["sender_name"] = role
            items.append(item)
        return {"session_id": str(session_id), "messages": items}

    def _settle(self) -> None:
        """Wait until every OME run this write started has ended, then index the Markdown."""
        client = self._need()
        data = self._app.state.lifespan_data
        engine = importlib.import_module("everos.service.memorize")._get_engine()
        if not client.portal.call(functools.partial(engine.wait_idle, timeout=self.opts.idle_timeout_s)):
            raise TimeoutError(f"everos OME runs still active after {self.opts.idle_timeout_s:.0f} s")
        orchestrator = data.get("cascade")
        if orchestrator is not None:
            client.portal.call(orchestrator.drain_fully)

    def write_chunk(self, messages, session_id, date, *, chunk_index=None) -> WriteResult:
        client = self._need()
        validate_messages(messages)
        if self.llm is None:
            raise BankStateError("everos harness: opened without an LLM endpoint, cannot write")
        payload = self._payload(messages, session_id, date)
        n0 = self.count()
        COUNTER.replies.clear()
        self._dead_letters.clear()
        calls0 = COUNTER.num_chat_calls
        COUNTER.chunk_index = chunk_index
        error: BaseException | None = None
        try:
            r = client.post(f"{API}/add", json={**payload, "defer_extraction": True})
            if r.status_code == 422:  # the chunk's shape (a tool turn without tool_call_id): caller bug
                COUNTER.chunk_index = None
                raise _ChunkRefused(f"write_chunk: EverOS refused the chunk: {r.text[:300]}")
            if r.status_code != 200:
                raise RuntimeError(f"everos /memory/add: HTTP {r.status_code}: {r.text[:300]}")
            r = client.post(f"{API}/flush", json={"session_id": payload["session_id"]})
            if r.status_code != 200:
                raise RuntimeError(f"everos /memory/flush: HTTP {r.status_code}: {r.text[:300]}")
        except _ChunkRefused as e:  # validated before anything is buffered: nothing was written
            raise ValueError(str(e)) from None
        except Exception as e:  # classified below
            error = e
        try:
            self._settle()  # also after a failed flush: its strategies may still be running
        except Exception as e:
            error = error or e
        finally:
            COUNTER.chunk_index = None
        n_calls = COUNTER.num_chat_calls - calls0
        try:
            n1 = self.count()
        except Exception as e:  # a store the write broke is a platform fault, never raised
            n1, error = n0, error or e
        delta = {"num_added": max(n1 - n0, 0), "num_deleted": max(n0 - n1, 0)}
        if error is not None:
            if is_parse_error(error):
                return WriteResult(
                    WriteStatus.POLICY_ERROR, n_calls, f"EverOS rejected the reply: {error!r:.300}", **delta
                )
            return WriteResult(
                WriteStatus.PLATFORM_ERROR, n_calls, f"everos write failed: {error!r:.300}", **delta
            )
        dead = [(d.strategy_name, d.error or "") for d in self._dead_letters]
        if any(not _PARSE_ERROR_RE.match(err) for _, err in dead):
            return WriteResult(
                WriteStatus.PLATFORM_ERROR, n_calls, f"everos strategy runs died: {dead!r:.300}", **delta
            )
        if dead:
            return WriteResult(
                WriteStatus.POLICY_ERROR, n_calls, f"EverOS rejected strategy replies: {dead!r:.300}", **delta
            )
        if delta["num_added"] == 0 and any(needed_cutout(r) for r in COUNTER.replies):
            return WriteResult(
                WriteStatus.POLICY_ERROR,
                n_calls,
                "zero memories from repaired JSON (silent failure malformed-as-platform-error)",
                **delta,
            )
        return WriteResult(WriteStatus.OK, n_calls, None, **delta)


class _ChunkRefused(Exception):
    pass


def _plain(v: Any) -> Any:
    return v.isoformat() if isinstance(v, dt.datetime | dt.date) else v


def _reset_everos_globals() -> None:
    """Forget every EverOS singleton bound to the previous memory root / settings."""
    from everos.config import settings

    settings.load_settings.cache_clear()
    for mod_name, attr in _GLOBALS:
        mod = sys.modules.get(mod_name)
        if mod is not None and hasattr(mod, attr):
            setattr(mod, attr, None)
