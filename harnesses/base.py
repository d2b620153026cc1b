"""The one interface every memory harness implements (silent failures: docs/glossary.md).

A *bank* is one directory on disk that a single framework owns. The rollout side drives it through
`Harness`: open -> write_chunk* -> close -> fork. The same interface is implemented in-process
(`harnesses.native`) and across a process boundary (`harnesses.sandbox.SandboxClient`), so rollout
code never knows whether the bank lives in its own process or in a framework venv.

Stdlib only: this module is imported inside every framework venv (no torch, no hymem_train).

Governing rule (docs/glossary.md): a bad policy action gets a low reward; a platform fault is never
disguised as policy behaviour. Hence the three-way `WriteStatus`.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

BANK_META_FILE = "bank.json"  # written at creation and at every fork; the bank's identity card
BANK_LOCK_FILE = "bank.lock"  # flock-ed while a bank is open; fork refuses an open bank
META_FORMAT_VERSION = 1


# --------------------------------------------------------------------------------------------- errors
class HarnessError(Exception):
    """Base of every error raised by this package."""


class ConfigurationError(HarnessError):
    """Bad input before any work: unknown framework or scene, missing venv, bad endpoint."""


class BankMismatchError(HarnessError):
    """The bank directory belongs to another framework, scene, version or config; it is left untouched."""


class BankStateError(HarnessError):
    """Operation on a bank in the wrong state (not open, still open while forking, missing)."""


class IdentityError(HarnessError):
    """A request carries another sandbox's / trajectory's identity (silent failure shared-identity)."""


class PlatformError(HarnessError):
    """The framework, its store or the sandbox process failed; never scored (silent failure platform-error-as-reward)."""


# --------------------------------------------------------------------------------------------- types
class WriteStatus(enum.StrEnum):
    OK = "ok"
    # the policy's output was malformed or unusable (incl. zero memories after lenient JSON repair):
    # a valid trajectory that gets a low reward (silent failure malformed-as-platform-error)
    POLICY_ERROR = "policy_error"
    # framework / store / process / timeout failure: retried, and if it persists excluded (silent failure platform-error-as-reward)
    PLATFORM_ERROR = "platform_error"


@dataclasses.dataclass(frozen=True)
class WriteResult:
    status: WriteStatus  # ok | policy_error | platform_error
    num_llm_calls: int  # LLM requests this write made (each one is a gateway segment)
    error: str | None = None  # what went wrong and where; on ok only a note (e.g. skipped invalid ops)
    num_added: int = 0  # entries created by this write
    num_updated: int = 0  # entries changed by this write
    num_deleted: int = 0  # entries removed by this write
    num_attempts: int = 1  # >1 when a platform error was retried (sandbox client)
    # a platform error that is the writer's own: its endpoint timed out (the evaluation scores it 0;
    # training excludes it like any platform error)
    writer_timeout: bool = False

    @property
    def ok(self) -> bool:
        return self.status is WriteStatus.OK

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WriteResult:
        return cls(**{**d, "status": WriteStatus(d["status"])})


@dataclasses.dataclass(frozen=True)
class MemoryEntry:
    id: str  # the framework's own id of the entry
    text: str  # the framework's canonical text of the entry (what size_tokens counts)
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)  # framework fields (dates, user...)
    score: float | None = None  # retrieval score, only set by search()

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MemoryEntry:
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class BankMetadata:
    framework: str  # "native" | "mem0" | "hy_memory" | "memoryos" | "everos"
    framework_version: str  # the installed distribution version the bank was written with
    scene: str  # framework sub-mode ("default"; hy-memory: chat | working | coding)
    config_hash: str  # sha256 prefix of the adapter's behaviour-relevant config
    bank_id: str  # unique id of this copy
    lineage: tuple[str, ...] = ()  # ancestor bank ids, oldest first (fork appends the parent)
    format_version: int = META_FORMAT_VERSION  # layout of bank.json itself

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["lineage"] = list(self.lineage)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BankMetadata:
        return cls(**{**d, "lineage": tuple(d.get("lineage", ()))})


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint (the gateway). `api_key` is the per-trajectory credential."""

    base_url: str  # e.g. http://127.0.0.1:8000/v1
    api_key: str  # the gateway checks it against the trajectory and bank (silent failure shared-identity)
    model: str  # model name sent in requests
    timeout_s: float = 120.0  # per request; a timeout is a platform error


class Tokenizer(Protocol):
    def encode(self, text: str, *args: Any, **kwargs: Any) -> Sequence[int]: ...


Message = dict[str, Any]  # OpenAI-style turn: {"role": "user"|"assistant"|..., "content": str, ...}


def count_tokens(tokenizer: Tokenizer | Callable[[str], Sequence[int]], text: str) -> int:
    """Token count without special tokens (a BOS per entry would inflate small banks)."""
    if hasattr(tokenizer, "encode"):
        try:
            return len(tokenizer.encode(text, add_special_tokens=False))
        except TypeError:
            return len(tokenizer.encode(text))
    return len(tokenizer(text))  # type: ignore[operator]


def config_hash(cfg: dict[str, Any]) -> str:
    """Stable hash of behaviour-relevant config (credentials and URLs excluded by the caller)."""
    blob = json.dumps(cfg, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def validate_messages(messages: Any) -> list[Message]:
    """Shape check of write_chunk input; a bad chunk is a caller bug, not policy behaviour."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("write_chunk: messages must be a non-empty list of {'role','content'} turns")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"write_chunk: messages[{i}] needs 'role' and 'content', got {m!r:.120}")
    return messages


# --------------------------------------------------------------------------------------------- bank files
def read_bank_meta(bank_dir: Path) -> BankMetadata | None:
    p = Path(bank_dir) / BANK_META_FILE
    if not p.exists():
        return None
    try:
        return BankMetadata.from_json(json.loads(p.read_text()))
    except (ValueError, TypeError, KeyError) as e:
        raise BankMismatchError(f"{p}: unreadable bank metadata: {e}") from None


def write_json_atomic(path: Path, obj: Any) -> None:
    """Nothing half-written: temp file in the same directory, fsync, rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_bank_matches(bank_dir: Path, expected: BankMetadata) -> BankMetadata:
    """Refuse a bank written by another framework / scene / version / config (no byte is modified)."""
    found = read_bank_meta(bank_dir)
    if found is None:
        raise BankStateError(f"{bank_dir}: not a bank (no {BANK_META_FILE}); open with create=True")
    for key in ("framework", "scene", "framework_version", "config_hash"):
        if getattr(found, key) != getattr(expected, key):
            raise BankMismatchError(
                f"{bank_dir}: bank has {key}={getattr(found, key)!r}, this harness has "
                f"{key}={getattr(expected, key)!r}; refusing to open it"
            )
    return found


def open_or_create_bank_dir(
    bank_dir: Path, expected: BankMetadata, create: bool
) -> tuple[BankMetadata, bool]:
    """The bank-directory half of every adapter's `open`: an existing bank must match `expected`
    (framework, scene, version, config; otherwise it is refused untouched), a new one is created
    only on request and only in an empty directory. Returns (metadata, created)."""
    bank_dir = Path(bank_dir)
    if read_bank_meta(bank_dir) is not None:
        return check_bank_matches(bank_dir, expected), False
    if not create:
        raise BankStateError(f"{bank_dir}: no bank here (pass create=True for a new one)")
    if bank_dir.exists() and any(bank_dir.iterdir()):
        raise BankStateError(f"{bank_dir}: not empty and not a bank; refusing to create one in it")
    bank_dir.mkdir(parents=True, exist_ok=True)
    meta = dataclasses.replace(expected, bank_id=new_bank_id())
    write_json_atomic(bank_dir / BANK_META_FILE, meta.to_json())
    return meta, True


class BankLock:
    """An exclusive flock on `<bank>/bank.lock` held while the bank is open.

    close() must release it (the issue: 'close it, releasing every file lock'), and fork checks it,
    so a bank is never copied while a writer may still be flushing.

    The fork-time probe (`is_held`) takes a *shared* lock for an instant: the report's 8 rollouts of
    a window fork the same parent bank at the same moment, and an exclusive probe made a concurrent
    probe see "held" and fail its rollout as a platform error (measured rates: docs/log/findings.md,
    "Harnesses: the fork-time bank-lock race"). Shared probes never conflict with each other; only an
    open bank's exclusive lock makes one fail. A writer's `acquire` that meets a probe's instant shared
    lock retries for up to `PROBE_GRACE_S` before it calls the bank open elsewhere.
    """

    PROBE_GRACE_S = 2.0

    def __init__(self, bank_dir: Path):
        self.path = Path(bank_dir) / BANK_LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.PROBE_GRACE_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                os.close(fd)
                raise BankStateError(f"{self.path.parent}: bank is open elsewhere (lock held)") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def is_held(bank_dir: Path) -> bool:
        p = Path(bank_dir) / BANK_LOCK_FILE
        if not p.exists():
            return False
        fd = os.open(p, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: concurrent probes don't collide
        except BlockingIOError:
            return True
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)


def fork_bank_dirs(src: Path, dsts: Sequence[Path]) -> list[BankMetadata]:
    """Copy a *closed* bank into each of `dsts` (which must not exist); each copy gets a new bank id
    and the parent appended to its lineage.

    Each copy is built in a temp sibling and renamed into place, so a crash leaves no half bank.
    Framework adapters whose store is a plain directory use this as-is (copy = fork).
    """
    src = Path(src)
    parent = read_bank_meta(src)
    if parent is None:
        raise BankStateError(f"{src}: cannot fork, not a bank (no {BANK_META_FILE})")
    if BankLock.is_held(src):
        raise BankStateError(f"{src}: cannot fork an open bank; close it first")
    for d in dsts:
        if Path(d).exists():
            raise BankStateError(f"{d}: fork destination already exists")
    out = []
    for d in dsts:
        d = Path(d)
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.fork-", dir=d.parent))
        try:
            shutil.copytree(src, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(BANK_LOCK_FILE))
            child = dataclasses.replace(
                parent, bank_id=new_bank_id(), lineage=(*parent.lineage, parent.bank_id)
            )
            write_json_atomic(tmp / BANK_META_FILE, child.to_json())
            os.rename(tmp, d)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        out.append(child)
    return out


def new_bank_id() -> str:
    return uuid.uuid4().hex[:16]


# --------------------------------------------------------------------------------------------- interface
class Harness(abc.ABC):
    """One memory framework driving one bank directory at a time.

    Lifecycle: `open(bank_dir, create=...)` -> `write_chunk`/`read_all`/`count`/`search` -> `close()`.
    `fork(src, dsts)` works on closed banks only. `read_all()` must return *every* entry and equal
    `count()` (silent failure capped-read-all: default page sizes and hidden caps).
    """

    framework: str = ""  # registry name, set by subclasses

    @abc.abstractmethod
    def open(self, bank_dir: str | os.PathLike[str], *, create: bool = False) -> BankMetadata:
        """Open (or, with create=True, create an empty) bank in `bank_dir`; takes the bank lock."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and release every file lock and store handle; idempotent."""

    @abc.abstractmethod
    def write_chunk(
        self,
        messages: list[Message],
        session_id: str,
        date: str,
        *,
        chunk_index: int | None = None,
    ) -> WriteResult:
        """Write one chunk through the framework's normal write path.

        `messages` are OpenAI-style turns; `date` is the chunk's session date (ISO string);
        `chunk_index` is forwarded to the gateway (header `X-Hymem-Chunk-Index`) so each LLM call
        lands in the right chunk's segment (silent failure chunk-unmapped). Never raises for policy output or
        platform faults: those come back as the result's status.
        """

    @abc.abstractmethod
    def read_all(self) -> list[MemoryEntry]:
        """Every entry of the bank (no pagination, no cap); asserts len == count()."""

    @abc.abstractmethod
    def count(self) -> int:
        """Number of entries, computed independently of read_all (a second path to the store)."""

    @abc.abstractmethod
    def search(self, query: str, k: int) -> list[MemoryEntry]:
        """Top-k entries by the framework's own retrieval."""

    def metadata(self) -> BankMetadata:
        """Framework, version, scene, config hash, bank id and lineage of the open bank."""
        self._need()  # BankStateError when no bank is open
        assert self._meta is not None
        return self._meta

    # ---- bank bookkeeping shared by the adapters: each keeps `_lock`, `_meta`, `_bank_dir`
    def _need(self) -> Any:
        """The open bank's store handle; raises BankStateError when no bank is open."""
        raise NotImplementedError

    def _release_bank(self) -> None:
        """The tail of every adapter's close(): release the bank lock and forget the bank; idempotent."""
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:
            lock.release()
        self._meta = self._bank_dir = None

    def fork(self, src: str | os.PathLike[str], dsts: Sequence[str | os.PathLike[str]]) -> list[BankMetadata]:
        """Copy a closed bank into N new bank directories (default: directory copy)."""
        return fork_bank_dirs(Path(src), [Path(d) for d in dsts])

    def size_tokens(self, tokenizer: Tokenizer | Callable[[str], Sequence[int]]) -> int:
        """Bank size in tokens: sum over entries of tokens(entry.text), the framework's canonical
        entry text (documented per adapter). Feeds the growth penalty."""
        return sum(count_tokens(tokenizer, e.text) for e in self.read_all())

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def checked_read_all(entries: list[MemoryEntry], count: int, where: str) -> list[MemoryEntry]:
    """Silent failure capped-read-all: a listing that silently paginates or caps must fail loudly."""
    if len(entries) != count:
        raise PlatformError(f"{where}: read_all returned {len(entries)} entries but count() is {count}")
    return entries
