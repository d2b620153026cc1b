"""Gateway counters per step: the gateway's counters are cumulative over the run; the log gets
each step's share (the mean batch size and mean in-flight count stay cumulative: ratios, not counts).

The rollout phase's own share is logged apart (`rollout/llm_calls`, `rollout/prompt_tokens`,
`rollout/completion_tokens`, `rollout/engine_batches`, and `rollout/mean_batch_size`: the engine's
batch occupancy while the step's rollouts ran): a step that also evaluates sends the held-out
rollouts through the same gateway, and its step totals would mix the two. The share is the counters'
change between the two rollout hooks, kept per step: with rl.overlap_rollout step k+1's rollouts run
(in another thread) while step k trains, before step k's metrics are logged."""

from __future__ import annotations

from typing import Any

from hymem_train.callbacks import Callback

MEAN_BATCH_SIZE = "gateway/mean_batch_size"
# ratios, logged as they stand (cumulative), never differenced; mean_in_flight: continuous batching only
RATIOS = (MEAN_BATCH_SIZE, "gateway/mean_in_flight")
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
        self.started: dict[int, dict[str, float]] = {}  # step -> counters when its rollouts began
        self.rollout: dict[int, dict[str, float]] = {}  # step -> its rollout phase's share

    def on_rollouts_start(self, step: int) -> None:
        self.started[step] = self.gateway.metrics()

    def on_rollouts(self, step: int, groups: list) -> None:
        # nothing but the step's rollouts calls the policy between the two hooks
        now, before = self.gateway.metrics(), self.started.pop(step)
        d = {k: now.get(k, 0.0) - before.get(k, 0.0) for k in (*ROLLOUT_SHARE, "gateway/batched_requests")}
        share = {ROLLOUT_SHARE[k]: d[k] for k in ROLLOUT_SHARE}
        batches = d["gateway/engine_batches"]
        share["rollout/mean_batch_size"] = d["gateway/batched_requests"] / batches if batches else 0.0
        self.rollout[step] = share

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        now = self.gateway.metrics()
        metrics.update({k: v - self.prev.get(k, 0.0) for k, v in now.items() if k not in RATIOS})
        metrics.update({k: now[k] for k in RATIOS if k in now})
        metrics.update(self.rollout.pop(step, {}))
        self.prev = now
