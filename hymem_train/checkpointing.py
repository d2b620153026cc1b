"""A stage's checkpoints in `<run>/checkpoints`: the DeepSpeed state (model, optimizer, RNG) with the
window scheduler's cursor inside, so a run killed at any point resumes from the last checkpoint
and redoes the windows it had not finished, losing none (docs/stages.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class StageCheckpoints:
    def __init__(self, trainer: Any, run_dir: str | Path, *, save_every: int, num_steps: int):
        self.trainer = trainer
        self.dir = Path(run_dir) / "checkpoints"
        self.save_every, self.num_steps = save_every, num_steps

    def resume(self) -> tuple[int, dict[str, Any]]:
        """Collective: (the trainer step to continue after, the saved client state); (0, {}) if new."""
        if not (self.dir / "latest").exists():
            return 0, {}
        state = self.trainer.load(str(self.dir))
        return int(state["step"]), state

    def maybe_save(
        self, step: int, scheduler: Any, *, force: bool = False, metrics: dict[str, float] | None = None
    ) -> None:
        """Collective: every `save_every` steps and at the last (`force`: now, unless this step already
        saved). `scheduler` is rank 0's (None on the other ranks); its cursor travels inside every rank's
        checkpoint. `metrics`: rank 0's row for this step, kept so that a run killed after the checkpoint
        but before the row reached metrics.jsonl still records the step (`MetricsLogger.restore`)."""
        scheduled = step % self.save_every == 0 or step == self.num_steps
        if scheduled == force:  # not due and not forced, or forced but already saved by the schedule
            return
        sent = self.trainer.broadcast(
            (scheduler.state(), dict(metrics or {})) if scheduler is not None else None
        )
        state, row = sent if sent is not None else (None, {})
        self.trainer.save(str(self.dir), {"stage_step": step, "scheduler": state, "step_metrics": row})
