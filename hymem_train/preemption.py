"""Preemption: finish the current step, checkpoint, and leave, so that a requeued job resumes there.

A request is the file `<run>/PREEMPT` (slurm/ray_job.sbatch touches it when Slurm sends SIGUSR1 before
the time limit or on `scancel --batch --signal=USR1`) or SIGUSR1 sent to the driver process itself.
After the checkpoint the driver writes `<run>/preempted.json`; the job script requeues on it, and the
next start resumes from the checkpoint like any restart (docs/stages.md, resume)."""

from __future__ import annotations

import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REQUEST = "PREEMPT"
MARKER = "preempted.json"
_PROCESS_START = time.time()  # this module loads with the stage, before the model


class Preemption:
    def __init__(self, run_dir: Path, trainer: Any, *, is_driver: bool):
        self.request, self.marker = run_dir / REQUEST, run_dir / MARKER
        self.trainer, self.is_driver = trainer, is_driver
        self._signalled = False
        if is_driver:
            # a request from before this process (a finished preemption, a stray touch) is not for it;
            # one the job script writes while this process starts up is newer, and is kept
            if self.request.exists() and self.request.stat().st_mtime < _PROCESS_START - 1.0:
                self.request.unlink()
            self.marker.unlink(missing_ok=True)
            signal.signal(signal.SIGUSR1, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signalled = True

    def requested(self) -> bool:
        """Collective (every rank at the same point of the step): whether the driver saw a request."""
        seen = self.is_driver and (self._signalled or self.request.exists())
        return bool(self.trainer.broadcast(seen))

    def stopped(self, step: int) -> None:
        """The checkpoint of `step` is written: tell the job script (driver only)."""
        if not self.is_driver:
            return
        self.request.unlink(missing_ok=True)
        self.marker.write_text(json.dumps({"step": step, "time": time.time()}) + "\n")
        log.warning("preempted after step %d: checkpoint written; the same command resumes from it", step)
