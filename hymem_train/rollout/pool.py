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


REPLACE, RETIRE, SEEN = "replace", "retire", "seen"


class ActorSlots:
    """The pool's Ray bookkeeping: `per_actor` slots per actor (the rollouts it runs at once), every
    actor's first slot handed out before any second one, and what an actor's death does. All the
    rollouts a dying actor was running report its death; the first one counts it, the rest see it."""

    def __init__(self, num_actors: int, per_actor: int, max_restarts: int):
        self.per_actor, self.max_restarts = per_actor, max_restarts
        self.deaths = [0] * num_actors  # per actor index: process deaths seen
        self.gens = [0] * num_actors  # per actor index: replacements so far (tells a death already seen)

    def usable(self, k: int) -> bool:
        return self.deaths[k] <= self.max_restarts

    def free(self) -> list[int]:
        """The free slots as a stack (pop() takes the next): actor indices, one per slot."""
        alive = [k for k in range(len(self.deaths)) if self.usable(k)]
        return [k for _ in range(self.per_actor) for k in alive][::-1]

    def died(self, k: int, gen: int) -> str:
        """A rollout sent to actor `k` at generation `gen` found it dead: REPLACE it (a new generation),
        RETIRE it (past max_restarts), or SEEN (another of its rollouts reported this death first)."""
        if gen != self.gens[k]:
            return SEEN
        self.deaths[k] += 1
        self.gens[k] += 1  # this actor process is over, replaced or not
        return REPLACE if self.usable(k) else RETIRE


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
        rollouts_per_worker: int = 1,
    ):
        """`resources`: Ray custom resources per worker, e.g. {"rollout": 1} to keep the workers on the
        nodes that advertise it (the nodes that hold no engine). `spread`: Ray's SPREAD strategy, the workers
        over every node that fits them (Ray's default packs a node first). A worker whose process dies is replaced by
        a new actor, up to `max_restarts` times per slot; its rollout becomes `lost_rollout` and
        `on_lost(trajectory_id)` lets the owner forget the trajectory (the gateway's identity and segments).
        `rollouts_per_worker`: rollouts one actor runs at once, on its threads (Ray's max_concurrency; the
        worker keeps one harness per task); a dying actor loses every rollout it was running."""
        self.on_lost, self.max_restarts = on_lost, max_restarts
        self.num_workers = num_workers
        self.slots = rollouts_per_worker
        self.use_ray = use_ray
        if use_ray:
            import ray

            self._actor_cls = ray.remote(
                num_cpus=num_cpus_per_worker,
                resources=dict(resources or {}),
                scheduling_strategy="SPREAD" if spread else "DEFAULT",
                max_concurrency=rollouts_per_worker,
            )(RolloutWorker)
            self._worker_kwargs = worker_kwargs
            self._actors = [self._actor_cls.remote(**worker_kwargs) for _ in range(num_workers)]
            self._slots = ActorSlots(num_workers, rollouts_per_worker, max_restarts)
        else:
            self._worker = RolloutWorker(**worker_kwargs)  # thread-safe: one harness per task
            self._ex = cf.ThreadPoolExecutor(num_workers * rollouts_per_worker, thread_name_prefix="rollout")

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
        free = self._slots.free()
        pending: dict[Any, tuple[int, int, int]] = {}
        while todo or pending:
            while free and todo:
                i, t = todo.pop()
                k = free.pop()
                pending[self._actors[k].run.remote(t)] = (i, k, self._slots.gens[k])
            if not pending:
                raise RuntimeError(f"every rollout worker died (max_restarts={self.max_restarts} each)")
            [ref], _ = ray.wait(list(pending), num_returns=1)
            i, k, gen = pending.pop(ref)
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
                verdict = self._slots.died(k, gen)
                if verdict == REPLACE:
                    # a fresh actor in its place (not Ray's max_restarts: then a call sent before the
                    # driver hears of the death fails like the killed task, and the state is rebuilt)
                    ray.kill(self._actors[k])
                    self._actors[k] = self._actor_cls.remote(**self._worker_kwargs)
                elif verdict == RETIRE:
                    log.warning(
                        "rollout worker %d died %d times: left out of the pool", k, self._slots.deaths[k]
                    )
                if not self._slots.usable(k):
                    continue
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
