"""Side jobs of a training stage, one per file (OLMo-core style): each is a small object the
step loop calls at a named point. None of them changes what is trained.

    on_rollouts_start(step)     before the step's rollouts are collected (driver only)
    on_rollouts(step, groups)   after the step's rollouts are collected (driver only)
The two rollout hooks run in the thread that collects: with rl.overlap_rollout, a background thread
collecting step k+1 while the main thread trains step k (and calls on_step_end(k)).
    on_step_end(step, metrics)  before the step's metrics are logged (driver only; may add metrics)
    on_train_end()              after the last step (driver only)
"""

from __future__ import annotations

from typing import Any


class Callback:
    def on_rollouts_start(self, step: int) -> None:
        pass

    def on_rollouts(self, step: int, groups: list[Any]) -> None:
        pass

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def on_train_end(self) -> None:
        pass


class Callbacks(Callback):
    """Calls each callback in order."""

    def __init__(self, callbacks: list[Callback]):
        self.callbacks = list(callbacks)

    def on_rollouts_start(self, step: int) -> None:
        for c in self.callbacks:
            c.on_rollouts_start(step)

    def on_rollouts(self, step: int, groups: list[Any]) -> None:
        for c in self.callbacks:
            c.on_rollouts(step, groups)

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        for c in self.callbacks:
            c.on_step_end(step, metrics)

    def on_train_end(self) -> None:
        for c in self.callbacks:
            c.on_train_end()
