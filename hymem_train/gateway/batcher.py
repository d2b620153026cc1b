"""Collects concurrent requests into batched engine calls.

A single worker thread owns the engine: it takes the first waiting request, gathers whatever else
arrives within `max_wait_s` (up to `max_batch_size`), and runs one batched `generate`. HTTP handlers
await the result without blocking the event loop, so 8 harness clients share one forward per step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import queue
import threading
import time

from hymem_train.engines.base import Engine, GenerationOutput, SamplingParams

log = logging.getLogger(__name__)


class Batcher:
    def __init__(self, engine: Engine, max_batch_size: int = 16, max_wait_s: float = 0.01):
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._q: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.batch_sizes: list[int] = []  # observability: how well requests were batched
        self._thread = threading.Thread(target=self._run, name="engine-batcher", daemon=True)
        self._thread.start()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        fut: cf.Future = cf.Future()
        self._q.put((prompt_ids, params, fut))
        return await asyncio.wrap_future(fut)

    def close(self) -> None:
        self._stop.set()
        self._q.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            first = self._q.get()
            if first is None:
                break
            batch = [first]
            deadline = time.monotonic() + self.max_wait_s
            while len(batch) < self.max_batch_size:
                left = deadline - time.monotonic()
                try:
                    item = self._q.get(timeout=max(left, 0)) if left > 0 else self._q.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._stop.set()
                    break
                batch.append(item)
            self.batch_sizes.append(len(batch))
            try:
                outs = self.engine.generate([b[0] for b in batch], [b[1] for b in batch])
            except Exception as e:  # every waiter gets the engine's error, nobody hangs
                log.exception("engine.generate failed for a batch of %d", len(batch))
                for b in batch:
                    b[2].set_exception(e)
                continue
            for b, o in zip(batch, outs, strict=True):
                b[2].set_result(o)


class Continuous:
    """The batcher's place for an engine that batches continuously itself (vLLM's AsyncLLM): each
    request goes into the running engine as it arrives, none waits for a batch to fill or finish."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.batch_sizes: list[int] = []  # no static batches
        self.in_flight_seen: list[int] = []  # requests already in the engine when each one arrived
        self._in_flight = 0
        self._lock = threading.Lock()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        with self._lock:
            self.in_flight_seen.append(self._in_flight)
            self._in_flight += 1
        try:
            return await asyncio.wrap_future(self.engine.submit(prompt_ids, params))  # type: ignore[attr-defined]
        finally:
            with self._lock:
                self._in_flight -= 1

    def close(self) -> None:
        pass
