"""A pool of rollout workers: Ray actors on a cluster (and locally with `ray.init()`), or threads in
this process for tests and debugging. Many windows' rollouts run at once, so the gateway's engine
batches across all of them."""

from __future__ import annotations

import concurrent.futures as cf
import logging
from typing import Any

from hymem_train.rollout.worker import RolloutResult, RolloutTask, RolloutWorker

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
    ):
        """`resources`: Ray custom resources per worker, e.g. {"rollout": 1} to keep the workers on the
        nodes that advertise it (the nodes that hold no engine)."""
        self.num_workers = num_workers
        self.use_ray = use_ray
        if use_ray:
            import ray
            from ray.util import ActorPool

            actor_cls = ray.remote(num_cpus=num_cpus_per_worker, resources=dict(resources or {}))(
                RolloutWorker
            )
            self._actors = [actor_cls.remote(**worker_kwargs) for _ in range(num_workers)]
            self._pool = ActorPool(self._actors)
        else:
            self._worker = RolloutWorker(**worker_kwargs)  # thread-safe: one harness per task
            self._ex = cf.ThreadPoolExecutor(num_workers, thread_name_prefix="rollout")

    def run(self, tasks: list[RolloutTask]) -> list[RolloutResult]:
        """Results in task order."""
        if self.use_ray:
            return list(self._pool.map(lambda a, t: a.run.remote(t), tasks))
        return list(self._ex.map(self._worker.run, tasks))

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
