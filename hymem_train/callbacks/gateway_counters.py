"""Gateway counters per step: the gateway's counters are cumulative over the run; the log gets
each step's share (the mean batch size stays cumulative: it is a ratio, not a count).

The rollout phase's own share is logged apart (`rollout/llm_calls`, `rollout/prompt_tokens`,
`rollout/completion_tokens`, `rollout/engine_batches`, and `rollout/mean_batch_size`: the engine's
batch occupancy while the step's rollouts ran): a step that also evaluates sends the held-out
rollouts through the same gateway, and its step totals would mix the two."""

from __future__ import annotations

from typing import Any

from hymem_train.callbacks import Callback

MEAN_BATCH_SIZE = "gateway/mean_batch_size"
# gateway counter -> the rollout phase's metric
ROLLOUT_SHARE = {
    "gateway/requests_ok": "rollout/llm_calls",
    "gateway/prompt_tokens": "rollout/prompt_tokens",
    "gateway/completion_tokens": "rollout/completion_tokens",
    "gateway/engine_batches": "rollout/engine_batches",
}


class GatewayCounterDeltas(Callback):
    def __init__(self, gateway: Any):
        self.gateway = gateway
        self.prev: dict[str, float] = {}
        self.rollout: dict[str, float] = {}  # the rollout phase's share, logged with the step

    def on_rollouts(self, step: int, groups: list) -> None:
        # nothing else calls the policy between the previous step's end and here: this is the rollout's
        now = self.gateway.metrics()
        d = {k: now.get(k, 0.0) - self.prev.get(k, 0.0) for k in (*ROLLOUT_SHARE, "gateway/batched_requests")}
        self.rollout = {ROLLOUT_SHARE[k]: d[k] for k in ROLLOUT_SHARE}
        batches = d["gateway/engine_batches"]
        self.rollout["rollout/mean_batch_size"] = d["gateway/batched_requests"] / batches if batches else 0.0

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        now = self.gateway.metrics()
        metrics.update({k: v - self.prev.get(k, 0.0) for k, v in now.items() if k != MEAN_BATCH_SIZE})
        metrics[MEAN_BATCH_SIZE] = now[MEAN_BATCH_SIZE]
        metrics.update(self.rollout)
        self.rollout = {}
        self.prev = now
