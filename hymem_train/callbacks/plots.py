"""PNG curves of the run's main metrics, drawn from `<run>/metrics.jsonl` when training ends."""

from __future__ import annotations

from typing import Any

from hymem_train.callbacks import Callback


class CurvePlot(Callback):
    def __init__(self, logger: Any, keys: list[str], name: str):
        self.logger, self.keys, self.name = logger, keys, name

    def on_train_end(self) -> None:
        self.logger.plot(self.keys, self.name)
