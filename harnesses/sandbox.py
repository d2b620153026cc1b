"""The sandbox: one harness adapter hosted in its own process and venv, driven over JSON lines on stdio.

Why a process per sandbox: the frameworks' pins conflict (MemOS needs
transformers<5), a framework crash must not take the rollout worker down, and a dead process is
unambiguous evidence of a platform fault (silent failure platform-error-as-reward) rather than an empty bank.

Protocol (one JSON object per line):
    client -> server  {"init": {...}}                       once, first line
    server -> client  {"ready": true, "pid": .., "framework_version": ..} | {"ready": false, "error": {...}}
    client -> server  {"id": n, "sandbox_id": s, "method": m, "params": {...}}
    server -> client  {"id": n, "ok": true, "result": ...} | {"id": n, "ok": false, "error": {"type", "message"}}

Guarantees:
- The server only touches paths under its sandbox root; any other path is refused.
- A request carrying another sandbox's id is refused and nothing runs (silent failure shared-identity).
- The framework's own prints cannot corrupt the protocol: fd 1 is moved to the log before import.
- Client side: EOF / exit / timeout of the server -> PLATFORM_ERROR. Each write is preceded by a
  snapshot of the bank; a platform error restores it (never a half-written bank), restarts the
  sandbox if needed and retries up to `num_retries` times; if it persists the write reports
  PLATFORM_ERROR with `num_attempts` so the rollout excludes the trajectory, never scores it.

Run directly only by SandboxClient: `<venv>/bin/python -m harnesses.sandbox`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from harnesses import base, callcount
from harnesses.base import (
    BankMetadata,
    BankStateError,
    ConfigurationError,
    Endpoint,
    Harness,
    IdentityError,
    MemoryEntry,
    PlatformError,
    WriteResult,
    WriteStatus,
)
from harnesses.callcount import COUNTER
from harnesses.frameworks import REPO_ROOT, get_spec, load_adapter_class, venv_python
from harnesses.native import NativeConfig

log = logging.getLogger(__name__)

_ERROR_TYPES = {
    cls.__name__: cls
    for cls in (
        base.HarnessError,
        ConfigurationError,
        base.BankMismatchError,
        BankStateError,
        IdentityError,
        PlatformError,
        ValueError,
    )
}


# ============================================================================================ server
class _Server:
    def __init__(self, init: dict[str, Any], proto_out):
        self.out = proto_out
        self.root = Path(init["root"]).resolve()
        self.sandbox_id = init["sandbox_id"]
        self.framework = init["framework"]
        spec = get_spec(self.framework, init["scene"])
        llm = Endpoint(**init["llm"]) if init.get("llm") else None
        embedder = Endpoint(**init["embedder"]) if init.get("embedder") else None
        if self.framework != "native":
            callcount.install([e.base_url for e in (llm, embedder) if e is not None])
        cls = load_adapter_class(self.framework)
        if self.framework == "native":
            self.harness: Harness = cls(llm, NativeConfig(**init.get("native", {})), scene=init["scene"])
            self.version = spec.version
        else:
            self.harness = cls(llm, embedder, scene=init["scene"], options=init.get("options", {}))
            self.version = self.harness.framework_version  # type: ignore[attr-defined]
            if self.version != spec.version:
                raise ConfigurationError(
                    f"venv {sys.prefix}: {spec.distribution} is {self.version}, harness pin is {spec.version}; "
                    f"recreate it with scripts/make_harness_venvs.sh {self.framework}"
                )

    def _inside(self, p: str) -> Path:
        path = Path(p).resolve()
        if path != self.root and self.root not in path.parents:
            raise IdentityError(f"sandbox {self.sandbox_id}: path {path} is outside its root {self.root}")
        return path

    def handle(self, req: dict[str, Any]) -> Any:
        if req.get("sandbox_id") != self.sandbox_id:
            raise IdentityError(
                f"sandbox {self.sandbox_id}: request {req.get('id')} carries identity {req.get('sandbox_id')!r}; refused"
            )
        m, p, h = req["method"], req.get("params", {}), self.harness
        if m == "open":
            return h.open(self._inside(p["bank_dir"]), create=p.get("create", False)).to_json()
        if m == "close":
            return h.close()
        if m == "write_chunk":
            return h.write_chunk(
                p["messages"], p["session_id"], p["date"], chunk_index=p.get("chunk_index")
            ).to_json()
        if m == "read_all":
            return [e.to_json() for e in h.read_all()]
        if m == "count":
            return h.count()
        if m == "search":
            return [e.to_json() for e in h.search(p["query"], int(p["k"]))]
        if m == "metadata":
            return h.metadata().to_json()
        if m == "fork":
            return [b.to_json() for b in h.fork(self._inside(p["src"]), [self._inside(d) for d in p["dsts"]])]
        if m == "ping":
            return {"pid": os.getpid()}
        if m == "stats":
            # offline proof: requests this process sent to anything but the gateway (must stay 0)
            return {
                "num_chat_calls": COUNTER.num_chat_calls,
                "num_embedding_calls": COUNTER.num_embedding_calls,
                "num_foreign_calls": COUNTER.num_foreign_calls,
                "foreign_urls": COUNTER.foreign_urls,
            }
        raise ValueError(f"sandbox: unknown method {m!r}")

    def send(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()


def _err(e: BaseException) -> dict[str, str]:
    name = type(e).__name__
    return {"type": name if name in _ERROR_TYPES else "PlatformError", "message": f"{name}: {e}"}


def serve() -> None:
    # the protocol owns the original stdout; anything the framework prints goes to stderr (the log)
    proto_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    line = sys.stdin.readline()
    try:
        server = _Server(json.loads(line)["init"], proto_out)
    except BaseException as e:
        traceback.print_exc()
        proto_out.write(json.dumps({"ready": False, "error": _err(e)}) + "\n")
        proto_out.flush()
        return
    server.send({"ready": True, "pid": os.getpid(), "framework_version": server.version})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            server.send({"id": req.get("id"), "ok": True, "result": server.handle(req)})
        except Exception as e:
            traceback.print_exc()
            server.send({"id": req.get("id"), "ok": False, "error": _err(e)})
    server.harness.close()


# ============================================================================================ client
class _SandboxDied(Exception):
    pass


class SandboxClient(Harness):
    """The rollout side of a sandbox: implements Harness by RPC to a child process."""

    def __init__(
        self,
        cfg,  # harnesses.registry.HarnessConfig
        llm: Endpoint | None,
        embedder: Endpoint | None,
        *,
        sandbox_root: Path,
        sandbox_id: str,
    ):
        self.cfg = cfg
        self.spec = get_spec(cfg.framework, cfg.scene)
        self.framework = cfg.framework
        self.python = venv_python(cfg)  # ConfigurationError naming the missing venv, before any work
        self.llm, self.embedder = llm, embedder
        self.root = Path(sandbox_root).resolve()
        self.sandbox_id = sandbox_id
        self._repo_root = REPO_ROOT
        self._proc: subprocess.Popen | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._next_id = 0
        self._open_bank: tuple[Path, bool] | None = None
        self.framework_version: str | None = None
        self.num_restarts = 0  # sandboxes started after the first (crashes), for metrics

    # ---- process management
    @property
    def log_path(self) -> Path:
        return self.root / f".sandbox-{self.sandbox_id}.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _env(self) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "VIRTUAL_ENV", "PYTHONHOME"))
        }
        home = self.root / ".home"
        home.mkdir(parents=True, exist_ok=True)
        env.update(
            PYTHONPATH=str(self._repo_root),
            PYTHONUNBUFFERED="1",
            HOME=str(home),  # frameworks write ~/.mem0, ~/.memos ...: keep it inside the sandbox
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            MEM0_TELEMETRY="False",
            MEM0_DIR=str(home / ".mem0"),
            ANONYMIZED_TELEMETRY="False",
            DO_NOT_TRACK="1",
            POSTHOG_DISABLED="1",
            TOKENIZERS_PARALLELISM="false",
        )
        if self.llm is not None:
            # any OpenAI client the framework builds on its own defaults to the gateway, never api.openai.com
            env.update(OPENAI_API_KEY=self.llm.api_key, OPENAI_BASE_URL=self.llm.base_url)
        return env

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:  # the child keeps its own copy of the fd
            self._proc = subprocess.Popen(
                [str(self.python), "-m", "harnesses.sandbox"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=logf,
                cwd=self.root,
                env=self._env(),
                text=True,
                bufsize=1,
            )
        self._lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self._proc, self._lines), daemon=True).start()
        init = {
            "root": str(self.root),
            "sandbox_id": self.sandbox_id,
            "framework": self.cfg.framework,
            "scene": self.cfg.scene,
            "llm": dataclasses.asdict(self.llm) if self.llm else None,
            "embedder": dataclasses.asdict(self.embedder) if self.embedder else None,
            "native": dataclasses.asdict(self.cfg.native),
            "options": dict(self.cfg.options),
        }
        try:
            self._send({"init": init})
            ready = self._recv(self.cfg.start_timeout_s)
        except _SandboxDied as e:
            raise PlatformError(
                f"sandbox {self.sandbox_id} ({self.framework}) failed to start: {e}"
            ) from None
        if not ready.get("ready"):
            self._kill()
            err = ready.get("error", {})
            raise _ERROR_TYPES.get(err.get("type"), PlatformError)(
                f"sandbox {self.sandbox_id} ({self.framework}, {self.python}): {err.get('message')}"
            )
        self.framework_version = ready.get("framework_version")

    @staticmethod
    def _pump(proc: subprocess.Popen, q: queue.Queue) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            q.put(line)
        q.put(None)  # EOF: the process is gone

    def _send(self, obj: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(obj) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise _SandboxDied(f"cannot write to sandbox: {e}; {self._log_tail()}") from None

    def _recv(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            self._kill()
            raise _SandboxDied(f"no answer within {timeout_s:.0f} s (killed); {self._log_tail()}") from None
        if line is None:
            rc = self._proc.wait(timeout=10) if self._proc else None
            raise _SandboxDied(f"sandbox process exited (rc={rc}); {self._log_tail()}")
        return json.loads(line)

    def _log_tail(self, n: int = 600) -> str:
        try:
            return "log tail: " + self.log_path.read_text(errors="replace")[-n:].strip()
        except OSError:
            return "no log"

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def shutdown(self) -> None:
        """Close the bank and stop the sandbox process."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                self.close()
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
            except (subprocess.TimeoutExpired, HarnessErrorTypes):
                self._kill()
        self._proc = None

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def call(
        self, method: str, *, sandbox_id: str | None = None, timeout_s: float | None = None, **params
    ) -> Any:
        """One RPC. Raises the sandbox's error type, or PlatformError if the sandbox died."""
        self.start()
        self._next_id += 1
        req = {
            "id": self._next_id,
            "sandbox_id": sandbox_id or self.sandbox_id,
            "method": method,
            "params": params,
        }
        try:
            self._send(req)
            resp = self._recv(timeout_s or self.cfg.rpc_timeout_s)
        except _SandboxDied as e:
            self._open_bank = None
            raise PlatformError(
                f"sandbox {self.sandbox_id} ({self.framework}) during {method}: {e}"
            ) from None
        if resp.get("id") != req["id"]:
            self._kill()
            raise PlatformError(
                f"sandbox {self.sandbox_id}: answer id {resp.get('id')} for request {req['id']}"
            )
        if not resp["ok"]:
            err = resp["error"]
            raise _ERROR_TYPES.get(err["type"], PlatformError)(err["message"])
        return resp["result"]

    # ---- Harness
    def open(self, bank_dir, *, create: bool = False) -> BankMetadata:
        bank_dir = Path(bank_dir).resolve()
        meta = BankMetadata.from_json(self.call("open", bank_dir=str(bank_dir), create=create))
        self._open_bank = (bank_dir, create)
        return meta

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self.call("close")
        self._open_bank = None

    def read_all(self) -> list[MemoryEntry]:
        return [MemoryEntry.from_json(d) for d in self.call("read_all")]

    def count(self) -> int:
        return int(self.call("count"))

    def search(self, query: str, k: int) -> list[MemoryEntry]:
        return [MemoryEntry.from_json(d) for d in self.call("search", query=query, k=k)]

    def metadata(self) -> BankMetadata:
        return BankMetadata.from_json(self.call("metadata"))

    def fork(self, src, dsts) -> list[BankMetadata]:
        res = self.call("fork", src=str(Path(src).resolve()), dsts=[str(Path(d).resolve()) for d in dsts])
        return [BankMetadata.from_json(d) for d in res]

    def write_chunk(self, messages, session_id, date, *, chunk_index=None) -> WriteResult:
        base.validate_messages(messages)
        if self._open_bank is None:
            raise BankStateError(f"sandbox {self.sandbox_id}: no bank open")
        bank_dir = self._open_bank[0]
        if not self.cfg.snapshot_before_write:
            res = self._write_once(messages, session_id, date, chunk_index)
            if res.status is WriteStatus.PLATFORM_ERROR:
                res = dataclasses.replace(
                    res, error=f"{res.error}; bank state unknown (no snapshot): discard it"
                )
            return res
        snapshot = self._snapshot(bank_dir)
        try:
            result: WriteResult | None = None
            for attempt in range(1, self.cfg.num_retries + 2):
                if attempt > 1:
                    self._restore(bank_dir, snapshot)
                    log.warning(
                        "sandbox %s: retrying write (attempt %d): %s", self.sandbox_id, attempt, result.error
                    )
                result = self._write_once(messages, session_id, date, chunk_index)
                result = dataclasses.replace(result, num_attempts=attempt)
                if result.status is not WriteStatus.PLATFORM_ERROR:
                    return result
            # persisted: leave the bank exactly as before the write; the caller excludes the trajectory
            self._restore(bank_dir, snapshot)
            assert result is not None
            return result
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)

    def _write_once(self, messages, session_id, date, chunk_index) -> WriteResult:
        t0 = time.monotonic()
        try:
            d = self.call(
                "write_chunk", messages=messages, session_id=session_id, date=date, chunk_index=chunk_index
            )
        except PlatformError as e:
            # LLM calls of a crashed attempt are unknown here; the gateway drops segments of attempts
            # that did not return ok (num_attempts tells it how many there were)
            return WriteResult(WriteStatus.PLATFORM_ERROR, 0, f"{e} (after {time.monotonic() - t0:.1f} s)")
        return WriteResult.from_json(d)

    def _snapshot(self, bank_dir: Path) -> Path:
        """Close the bank, copy it aside, reopen: the restore point of this write."""
        snap = bank_dir.parent / f".{bank_dir.name}.prewrite-{self.sandbox_id}"
        shutil.rmtree(snap, ignore_errors=True)
        self.call("close")
        shutil.copytree(bank_dir, snap, ignore=shutil.ignore_patterns(base.BANK_LOCK_FILE))
        self.open(bank_dir)
        return snap

    def _restore(self, bank_dir: Path, snap: Path) -> None:
        """Put the pre-write bank back (restarting a dead sandbox first) and reopen it."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                self.call("close", timeout_s=60)
            except PlatformError:
                self._kill()
        if self._proc is not None and self._proc.poll() is not None:
            self.num_restarts += 1
        # copy first, then two renames: at no point is `bank_dir` a partial copy
        fresh = bank_dir.parent / f".{bank_dir.name}.restore-{self.sandbox_id}"
        trash = bank_dir.parent / f".{bank_dir.name}.failed-{self.sandbox_id}"
        for p in (fresh, trash):
            shutil.rmtree(p, ignore_errors=True)
        shutil.copytree(snap, fresh)
        os.rename(bank_dir, trash)
        os.rename(fresh, bank_dir)
        shutil.rmtree(trash, ignore_errors=True)
        self.open(bank_dir)


HarnessErrorTypes = (base.HarnessError, OSError)


if __name__ == "__main__":
    serve()
