"""Rollout workers: one rollout = one window written chunk by chunk from a fork of the parent bank.

Report recipe: each of a window's 8 rollouts starts from an independent copy of the same
parent bank and writes every chunk of the window through the harness's own write path; every LLM
call goes through the gateway under the rollout's own credential (silent failure shared-identity) with the chunk
index declared first (silent failure chunk-unmapped). After each chunk the worker closes the bank and snapshots
it (the reward's PRM probes search the bank state right after chunk t).

Fault handling: the harness retries platform errors itself (restoring the bank first); a platform
error that persists ends the rollout as platform_error (excluded by the reward, never scored:
silent failure platform-error-as-reward). A malformed policy output is a policy_error chunk: the rollout continues and the
reward scores whatever the bank holds (silent failure malformed-as-platform-error). When a write needed retries, only the
segments of the final attempt are kept: the discarded attempt's calls did not produce the bank the
chunk is scored on.

A call the gateway refused as over its prompt cap (`gateway.prompt_over_cap: drop_chunk`) ends the
rollout as platform_error whatever the harness made of the refusal (docs/glossary.md: the context
budget is a limit of the platform, not an action of the policy).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_pipeline.chunking import iso_date, render_turn
from data_pipeline.schema import Chunk, Window
from harnesses.base import Endpoint, WriteResult, WriteStatus, fork_bank_dirs
from harnesses.registry import HarnessConfig, make_harness
from hymem_train.gateway.client import GatewayAdmin
from hymem_train.rollout.config import FaultConfig
from hymem_train.segments import Segment
from reward.records import ChunkSnapshot, RolloutRecord

log = logging.getLogger(__name__)

M_SEGMENTS = "rollout/segments"  # LLM calls kept for training, sum
M_DISCARDED = "rollout/discarded_segments"  # calls of retried (failed) write attempts, sum
M_POLICY_ERRORS = "rollout/policy_error_chunks"  # chunks whose write was malformed policy output, sum
M_PLATFORM_ERRORS = "rollout/platform_error_rollouts"  # rollouts ended by a persistent platform fault, sum
M_OVER_CAP = (
    "rollout/prompt_over_cap_rollouts"  # rollouts ended by a call over the prompt cap (drop_chunk), sum
)
M_WRITE_S = "perf/rollout_write_s"  # seconds spent in harness writes, sum
# sandboxes restarted after a crash, each with the bank restored from its pre-write snapshot, sum (a
# crash reported as a clean write would restart nothing: silent failure platform-error-as-reward, tests/stages/test_fault_injection.py)
M_RESTARTS = "rollout/sandbox_restarts"
# chunks whose write itself reported (or raised) a platform fault after the harness's retries, sum; a
# bank unreadable after a write reported OK is a platform error too, but not counted here
M_PLATFORM_WRITES = "rollout/platform_error_writes"
# rollouts whose worker process died mid-rollout (Ray restarts the actor; the rollout is a platform_error)
M_LOST = "rollout/lost_worker_rollouts"


@dataclass
class RolloutTask:
    window: Window  # the window to write
    chunks: list[Chunk]  # its chunks, in window order
    rollout_index: int  # 0..G-1 within the window's group
    harness: str  # harness config name (key of the worker's harness configs)
    parent_bank: str | None  # closed parent bank directory; None = start from an empty bank
    out_dir: str  # this rollout's directory (bank, snapshots, sandbox files)
    step: int = 0  # training step (part of the trajectory id)
    # under data.per_harness the harness name (part of the trajectory id: the same window runs in several
    # harnesses in one step); "" under the data.path shorthand (ids as before)
    scope: str = ""


@dataclass
class RolloutResult:
    record: RolloutRecord  # what the reward service scores
    segments: list[Segment]  # LLM calls kept for training, chunk order then call order
    writes: list[dict[str, Any]]  # WriteResult of each chunk (json)
    metrics: dict[str, float] = field(default_factory=dict)


def trajectory_id(task: RolloutTask) -> str:
    """URL-safe identity (it may appear in gateway paths)."""
    scope = f"{task.scope}-" if task.scope else ""
    tid = f"s{task.step}-{scope}{task.window.window_id}-r{task.rollout_index}"
    return tid.replace("/", "_").replace(":", "_")


def chunk_messages(chunk: Chunk) -> list[dict[str, str]]:
    """The chunk's turns as OpenAI-style messages: chat roles stay, named speakers prefix the text."""
    msgs = []
    for t in chunk.turns:
        if t.speaker in ("user", "assistant"):
            msgs.append({"role": t.speaker, "content": t.text})
        else:
            msgs.append({"role": "user", "content": render_turn(t)})
    return msgs or [{"role": "user", "content": "(empty chunk)"}]


class RolloutWorker:
    """Drives one harness per rollout. Plain class; `ray.remote(RolloutWorker)` makes it an actor."""

    def __init__(
        self,
        harnesses: dict[str, HarnessConfig],
        gateway_url: str,
        admin_token: str,
        model_name: str = "policy",
        embedding_model: str = "all-MiniLM-L6-v2",
        tokenizer_path: str = "",
        faults: FaultConfig | None = None,
    ):
        # the raw `tokenizers` file, not transformers: a Ray actor then never imports torch
        from tokenizers import Tokenizer

        tok_dir = (
            Path(tokenizer_path)
            if tokenizer_path
            else Path(__file__).resolve().parents[1] / "assets" / "tokenizer"
        )
        self.faults = faults or FaultConfig()
        self.harnesses = harnesses
        self.admin = GatewayAdmin(gateway_url, admin_token)
        self.model_name = model_name
        self.embedding_model = embedding_model
        self.tokenizer = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))

    def _maybe_exit(self, task: RolloutTask, pos: int) -> None:
        """Fault injection: this worker's process dies (as an OOM kill would) at chunk `pos`."""
        if f"{task.rollout_index}:{pos}" in self.faults.kill_worker:
            os._exit(17)

    def _maybe_kill(self, harness, task: RolloutTask, pos: int):
        if f"{task.rollout_index}:{pos}" not in self.faults.kill_sandbox:
            return None
        stop = threading.Event()
        threading.Thread(target=kill_sandboxes_until, args=(harness, stop), daemon=True).start()
        return stop

    def _foreign_call(self, cred: str, tid: str) -> None:
        """A call that presents this trajectory's key under another trajectory's path: the gateway must
        refuse it (403) and count it (silent failure shared-identity); nothing is recorded."""
        import httpx

        r = httpx.post(
            f"{self.admin.url}/t/{tid}-impostor/v1/chat/completions",
            headers={"authorization": f"Bearer {cred}"},
            json={"model": self.model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=30,
        )
        if r.status_code != 403:
            raise RuntimeError(f"gateway accepted a foreign identity (HTTP {r.status_code})")

    def where(self) -> dict:
        """The node this worker runs on (Ray's view; the driver's process when not an actor)."""
        try:
            import ray

            if ray.is_initialized():
                return {
                    "node_id": ray.get_runtime_context().get_node_id(),
                    "node_ip": ray.util.get_node_ip_address(),
                    "pid": os.getpid(),
                }
        except ImportError:
            pass
        return {"node_id": "", "node_ip": socket.gethostname(), "pid": os.getpid()}

    def run(self, task: RolloutTask) -> RolloutResult:
        cfg = self.harnesses[task.harness]
        tid = trajectory_id(task)
        out = Path(task.out_dir)
        if out.exists():  # a resumed step redoes the rollout from its parent: start clean
            shutil.rmtree(out)
        out.mkdir(parents=True)
        bank_dir = out / "bank"
        cred = self.admin.register(tid, bank_id=str(bank_dir))
        llm = Endpoint(self.admin.base_url, cred, self.model_name)
        emb = Endpoint(self.admin.base_url, cred, self.embedding_model)
        harness = make_harness(cfg, llm, emb, sandbox_root=out, sandbox_id=tid)
        snapshots: list[ChunkSnapshot] = []
        writes: list[WriteResult] = []
        status = "ok"
        t_write = 0.0
        crashed_writes, in_write = 0, False
        try:
            if task.parent_bank:
                # the parent lives outside this rollout's sandbox root: the rollout side copies it in
                # (every adapter's fork is the directory copy), then the sandbox opens its own copy
                fork_bank_dirs(Path(task.parent_bank), [bank_dir])
                harness.open(bank_dir)
            else:
                harness.open(bank_dir, create=True)
            for pos, chunk in enumerate(task.chunks):
                self.admin.set_chunk(tid, chunk.index)
                t0 = time.perf_counter()
                killer = self._maybe_kill(harness, task, pos)
                self._maybe_exit(task, pos)
                if task.rollout_index in self.faults.foreign_identity and pos == 0:
                    self._foreign_call(cred, tid)
                in_write = True
                res = harness.write_chunk(
                    chunk_messages(chunk),
                    chunk.session_ids[0] if chunk.session_ids else chunk.chunk_id,
                    iso_date(chunk.date),
                    chunk_index=chunk.index,
                )
                t_write += time.perf_counter() - t0
                if killer is not None:
                    killer.set()
                in_write = False
                writes.append(res)
                crashed_writes += res.status is WriteStatus.PLATFORM_ERROR
                size = None
                if res.status is not WriteStatus.PLATFORM_ERROR:
                    try:
                        size = harness.size_tokens(self.tokenizer)
                    except Exception as e:  # an unreadable bank is a platform fault, never a size of 0
                        log.warning("rollout %s chunk %d: size_tokens failed: %s", tid, chunk.index, e)
                        res = WriteResult(WriteStatus.PLATFORM_ERROR, res.num_llm_calls, f"size_tokens: {e}")
                        writes[-1] = res
                harness.close()
                last = pos == len(task.chunks) - 1
                snap = bank_dir if last else out / f"snap_c{chunk.index}"
                if not last:
                    harness.fork(bank_dir, [snap])
                snapshots.append(ChunkSnapshot(chunk.index, str(snap), size, res.status.value))
                if res.status is WriteStatus.PLATFORM_ERROR:
                    status = "platform_error"
                    for rest in task.chunks[pos + 1 :]:  # the reward needs one snapshot per chunk
                        snapshots.append(ChunkSnapshot(rest.index, str(snap), None, "platform_error"))
                    break
                if not last:
                    harness.open(bank_dir)
        except Exception as e:  # a crashed sandbox or store: the whole rollout is a platform fault
            log.exception("rollout %s failed", tid)
            crashed_writes += in_write
            status = "platform_error"
            done = {s.chunk_index for s in snapshots}
            for c in task.chunks:
                if c.index not in done:
                    snapshots.append(ChunkSnapshot(c.index, str(bank_dir), None, "platform_error"))
            writes.append(WriteResult(WriteStatus.PLATFORM_ERROR, 0, f"{type(e).__name__}: {e}"))
        finally:
            try:
                harness.close()
            finally:
                shutdown = getattr(harness, "shutdown", None)
                if callable(shutdown):
                    shutdown()
        segments = self.admin.drain_segments(tid)
        dropped = self.admin.drain_dropped(tid)
        self.admin.unregister(tid)
        if dropped:
            first = min(d["chunk_index"] for d in dropped)
            log.warning(
                "rollout %s: %d call(s) over gateway.max_prompt_tokens (first at chunk %d, %d tokens): "
                "platform_error (gateway.prompt_over_cap=drop_chunk)",
                tid,
                len(dropped),
                first,
                max(d["prompt_tokens"] for d in dropped),
            )
            status = "platform_error"
            snapshots = [
                s
                if s.chunk_index < first
                else ChunkSnapshot(s.chunk_index, s.bank_dir, None, "platform_error")
                for s in snapshots
            ]
        kept, discarded = keep_final_attempts(segments, task.chunks, writes)
        record = RolloutRecord(
            trajectory_id=tid, chunks=snapshots, status=status, segment_chunks=[s.chunk_index for s in kept]
        )
        metrics = {
            M_SEGMENTS: float(len(kept)),
            M_DISCARDED: float(discarded),
            M_POLICY_ERRORS: float(sum(w.status is WriteStatus.POLICY_ERROR for w in writes)),
            M_PLATFORM_ERRORS: float(status == "platform_error"),
            M_OVER_CAP: float(bool(dropped)),
            M_WRITE_S: t_write,
            M_RESTARTS: float(getattr(harness, "num_restarts", 0)),  # 0 in process (no sandbox)
            M_PLATFORM_WRITES: float(crashed_writes),
        }
        return RolloutResult(record, kept, [w.to_json() for w in writes], metrics)


def lost_rollout(task: RolloutTask, reason: str) -> RolloutResult:
    """The result of a rollout whose worker process died mid-rollout: a platform_error with every chunk
    excluded and nothing to train on (silent failure platform-error-as-reward: never scored, never trained on, never promoted)."""
    bank = str(Path(task.out_dir) / "bank")
    record = RolloutRecord(
        trajectory_id=trajectory_id(task),
        chunks=[ChunkSnapshot(c.index, bank, None, "platform_error") for c in task.chunks],
        status="platform_error",
        segment_chunks=[],
    )
    writes = [WriteResult(WriteStatus.PLATFORM_ERROR, 0, f"rollout worker lost: {reason}").to_json()]
    metrics = {M_SEGMENTS: 0.0, M_PLATFORM_ERRORS: 1.0, M_LOST: 1.0}
    return RolloutResult(record, [], writes, metrics)


def kill_sandboxes_until(harness, stop) -> None:
    """SIGKILL every sandbox process the harness starts until `stop` is set (each retry included)."""
    killed: set[int] = set()
    while not stop.wait(0.05):
        pid = getattr(harness, "pid", None)
        if pid and pid not in killed:
            killed.add(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def keep_final_attempts(
    segments: list[Segment], chunks: list[Chunk], writes: list[WriteResult]
) -> tuple[list[Segment], int]:
    """Per chunk keep the last `num_llm_calls` calls (the attempt that produced the bank)."""
    by_chunk: dict[int, list[Segment]] = defaultdict(list)
    for s in segments:
        by_chunk[s.chunk_index].append(s)
    kept: list[Segment] = []
    discarded = 0
    for c, w in zip(chunks, writes, strict=False):
        segs = sorted(by_chunk.pop(c.index, []), key=lambda s: s.call_index)
        n = min(w.num_llm_calls, len(segs)) if w.num_attempts > 1 else len(segs)
        discarded += len(segs) - n
        kept.extend(segs[len(segs) - n :])
    # a segment under a chunk the rollout never wrote would be a mapping bug: keep it so the
    # reward's chunk-mapping check raises (silent failure chunk-unmapped) instead of dropping it here
    for segs in by_chunk.values():
        kept.extend(segs)
    return kept, discarded
