"""A pool of rollout workers: Ray actors on a cluster (and locally with `ray.init()`), or threads in
this process for tests and debugging. Many windows' rollouts run at once, so the gateway's engine
batches across all of them."""

from __future__ import annotations

import concurrent.futures as cf
import logging
from collections.abc import Callable
from typing import Any

from hymem_train.rollout.worker import RolloutResult, RolloutTask, RolloutWorker, lost_rollout

log = logging.getLogger(__name__)


class RolloutPool:
    def __init__(
        self,
        worker_kwargs: dict[str, Any],
        num_workers: int,
        *,
        use_ray: bool = True,
        num_cpus_per_worker: float = 0.25,
        resources: dict[str, float] | None = None,
        spread: bool = False,
        max_restarts: int = 3,
        on_lost: Callable[[str], None] | None = None,
    ):
        """`resources`: Ray custom resources per worker, e.g. {"rollout": 1} to keep the workers on the
        nodes that advertise it (the nodes that hold no engine). `spread`: Ray's SPREAD strategy, the workers
        over every node that fits them (Ray's default packs a node first). A worker whose process dies is replaced by
        a new actor, up to `max_restarts` times per slot; its rollout becomes `lost_rollout` and
        `on_lost(trajectory_id)` lets the owner forget the trajectory (the gateway's identity and segments)."""
        self.on_lost, self.max_restarts = on_lost, max_restarts
        self.num_workers = num_workers
        self.use_ray = use_ray
        if use_ray:
            import ray

            self._actor_cls = ray.remote(
                num_cpus=num_cpus_per_worker,
                resources=dict(resources or {}),
                scheduling_strategy="SPREAD" if spread else "DEFAULT",
            )(RolloutWorker)
            self._worker_kwargs = worker_kwargs
            self._actors = [self._actor_cls.remote(**worker_kwargs) for _ in range(num_workers)]
            self._deaths = [0] * num_workers  # per actor index: process deaths seen
        else:
            self._worker = RolloutWorker(**worker_kwargs)  # thread-safe: one harness per task
            self._ex = cf.ThreadPoolExecutor(num_workers, thread_name_prefix="rollout")

    def run(self, tasks: list[RolloutTask]) -> list[RolloutResult]:
        """Results in task order."""
        if self.use_ray:
            return self._run_ray(tasks)
        return list(self._ex.map(self._worker.run, tasks))

    def _run_ray(self, tasks: list[RolloutTask]) -> list[RolloutResult]:
        import ray
        from ray.exceptions import RayActorError

        results: list[RolloutResult | None] = [None] * len(tasks)
        todo = list(enumerate(tasks))[::-1]
        free = [k for k in range(len(self._actors)) if self._deaths[k] <= self.max_restarts][::-1]
        pending: dict[Any, tuple[int, int]] = {}
        while todo or pending:
            while free and todo:
                i, t = todo.pop()
                k = free.pop()
                pending[self._actors[k].run.remote(t)] = (i, k)
            if not pending:
                raise RuntimeError(f"every rollout worker died (max_restarts={self.max_restarts} each)")
            [ref], _ = ray.wait(list(pending), num_returns=1)
            i, k = pending.pop(ref)
            try:
                results[i] = ray.get(ref)
            except RayActorError as e:  # the process died mid-rollout: replaced below
                lost = lost_rollout(tasks[i], type(e).__name__)
                log.warning(
                    "rollout %s: its worker died (%s); a platform_error", lost.record.trajectory_id, e
                )
                results[i] = lost
                if self.on_lost is not None:
                    self.on_lost(lost.record.trajectory_id)
                self._deaths[k] += 1
                if self._deaths[k] > self.max_restarts:
                    log.warning("rollout worker %d died %d times: left out of the pool", k, self._deaths[k])
                    continue
                # a fresh actor in its place (not Ray's max_restarts: then a call sent before the driver
                # hears of the death fails like the killed task, and the actor's state is rebuilt anyway)
                ray.kill(self._actors[k])
                self._actors[k] = self._actor_cls.remote(**self._worker_kwargs)
            free.append(k)
        return results  # type: ignore[return-value]

    def placement(self) -> list[dict]:
        """Where each worker runs: node id, node IP, pid."""
        if self.use_ray:
            import ray

            return ray.get([a.where.remote() for a in self._actors])
        return [self._worker.where()]

    def shutdown(self) -> None:
        if self.use_ray:
            import ray

            for a in self._actors:
                ray.kill(a)
        else:
            self._ex.shutdown(wait=True)
