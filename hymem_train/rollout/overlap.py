"""The RL loop's rollout batches, collected on the step's clock or, under `rl.overlap_rollout`, one step
ahead in a background thread.

Overlap (off by default; the report is synchronous): once step k's batch is scored and its banks
promoted, step k+1's batch is collected while step k trains, and waited for before step k's weights
sync, so the engine never changes weights mid-rollout and every batch is exactly one version stale.
The PPO ratio against the engine's log-probs sees that lag (`policy_lag`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from hymem_train.rollout.collector import RolloutCollector, WindowRollouts


@dataclass
class Batch:
    """One step's rollouts, scored and turned into train items (driver)."""

    step: int
    groups: list[WindowRollouts]
    scored: list[Any]  # reward.harness_rewards results, one per group
    items: list[Any]  # trainer items, every call of chunk t of rollout i carrying A[i, t]
    seconds: dict[str, float]  # phase -> seconds: rollout, reward
    span: tuple[float, float]  # perf_counter() when collection began and ended


class RolloutBatches:
    """`take(step)` gives step's batch: collected now, or the one `prefetch` started while the previous
    step trained. `collect(step) -> Batch` reads the scheduler and never advances it."""

    def __init__(self, collect: Callable[[int], Batch], overlap: bool, timer: Any):
        self.collect, self.timer = collect, timer
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="overlapped-rollout") if overlap else None
        self._pending: Future | None = None  # step k+1's batch, being collected while step k trains
        self._ready: Batch | None = None  # step k+1's batch, collected; step k+1 trains on it

    def take(self, step: int) -> Batch:
        if self._ready is not None:  # collected while the previous step trained (on that step's clock)
            batch, self._ready = self._ready, None
            return batch
        batch = self.collect(step)
        for phase, seconds in batch.seconds.items():
            self.timer.add(phase, seconds)
        return batch

    def prefetch(self, step: int) -> None:
        """Under overlap: start collecting `step`'s batch now, in the background."""
        if self._pool is not None:
            self._pending = self._pool.submit(self.collect, step)

    def wait(self, trained: tuple[float, float]) -> dict[str, float]:
        """Before the weights sync: the engine keeps its weights until the prefetched batch is in."""
        if self._pending is None:
            return {}
        with self.timer("rollout"):
            self._ready, self._pending = self._pending.result(), None
        return overlap_metrics(self._ready, trained)

    def drop(self, collector: RolloutCollector) -> None:
        """A preempted job: the batch collected for a step it will not train is cleaned up."""
        if self._ready is not None:
            collector.clean(self._ready.step)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def timed_batch(
    step: int,
    collect_groups: Callable[[], list[WindowRollouts]],
    score: Callable[[list[WindowRollouts]], tuple[list[Any], list[Any]]],
) -> Batch:
    """A Batch from its two phases, each timed: the rollouts, then their scores and train items."""
    t0 = time.perf_counter()
    groups = collect_groups()
    t1 = time.perf_counter()
    scored, items = score(groups)
    t2 = time.perf_counter()
    return Batch(step, groups, scored, items, {"rollout": t1 - t0, "reward": t2 - t1}, (t0, t2))


def policy_lag(items: list[Any], weights_version: int) -> dict[str, float]:
    """How many weight versions the sampling policy trailed the one being trained, measured from the
    version the engine stamped on every segment (0 = on-policy; 1 under rl.overlap_rollout)."""
    lags = [weights_version - it.segment.policy_version for it in items]
    if not lags:
        return {}
    return {"rollout/policy_lag_max": float(max(lags)), "rollout/policy_lag_mean": sum(lags) / len(lags)}


def overlap_metrics(batch: Batch, trained: tuple[float, float]) -> dict[str, float]:
    """The next step's collection, run in the background during this step: its phases' seconds and
    how many of them the training hid (`overlap/hidden_s`)."""
    (b0, b1), (t0, t1) = batch.span, trained
    return {
        "overlap/next_rollout_s": batch.seconds["rollout"],
        "overlap/next_reward_s": batch.seconds["reward"],
        "overlap/hidden_s": max(0.0, min(b1, t1) - max(b0, t0)),
    }
