"""Gateway counters per step: the gateway's counters are cumulative over the run; the log gets
each step's share (the mean batch size stays cumulative: it is a ratio, not a count)."""

from __future__ import annotations

from typing import Any

from hymem_train.callbacks import Callback

MEAN_BATCH_SIZE = "gateway/mean_batch_size"


class GatewayCounterDeltas(Callback):
    def __init__(self, gateway: Any):
        self.gateway = gateway
        self.prev: dict[str, float] = {}

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        now = self.gateway.metrics()
        metrics.update({k: v - self.prev.get(k, 0.0) for k, v in now.items() if k != MEAN_BATCH_SIZE})
        metrics[MEAN_BATCH_SIZE] = now[MEAN_BATCH_SIZE]
        self.prev = now
