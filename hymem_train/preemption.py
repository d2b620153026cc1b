"""Preemption: finish the current step, checkpoint, and leave, so that a requeued job resumes there.

A request is the file `<run>/PREEMPT` (slurm/ray_job.sbatch touches it when Slurm sends SIGUSR1 before
the time limit or on `scancel --batch --signal=USR1`) or SIGUSR1 sent to the driver process itself.
After the checkpoint the driver writes `<run>/preempted.json`; the job script requeues on it, and the
next start resumes from the checkpoint like any restart (docs/stages.md, resume)."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REQUEST = "PREEMPT"
MARKER = "preempted.json"


class Preemption:
    def __init__(self, run_dir: Path, trainer: Any, *, is_driver: bool):
        self.request, self.marker = run_dir / REQUEST, run_dir / MARKER
        self.trainer, self.is_driver = trainer, is_driver
        self._signalled = False
        if is_driver:
            # a request already here is kept: the job script may write one while this process starts
            # (it clears stale ones before it starts the trainer); a run that finishes drops it (`done`)
            self.marker.unlink(missing_ok=True)
            if threading.current_thread() is threading.main_thread():  # Python's rule for handlers
                signal.signal(signal.SIGUSR1, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signalled = True

    def requested(self) -> bool:
        """Collective (every rank at the same point of the step): whether the driver saw a request."""
        seen = self.is_driver and (self._signalled or self.request.exists())
        return bool(self.trainer.broadcast(seen))

    def done(self) -> None:
        """The run finished: a request that came too late has nothing left to stop."""
        if self.is_driver:
            self.request.unlink(missing_ok=True)

    def stopped(self, step: int) -> None:
        """The checkpoint of `step` is written: tell the job script (driver only)."""
        if not self.is_driver:
            return
        self.request.unlink(missing_ok=True)
        self.marker.write_text(json.dumps({"step": step, "time": time.time()}) + "\n")
        log.warning("preempted after step %d: checkpoint written; the same command resumes from it", step)
