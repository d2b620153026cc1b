"""Rollout configs: the worker pool and its modes (RolloutConfig), fault injection (FaultConfig).
No Ray or HTTP import here, so config schemas stay light."""

from __future__ import annotations

from dataclasses import dataclass, field

ROLLOUT_MODES = ("train", "rollout_only", "train_only")


@dataclass
class FaultConfig:
    """Fault injection for chaos tests of a whole run (off by default; docs/glossary.md).

    Each entry names rollouts by their index within the window's group, so a run hits the same
    faults on every window; "i:t" adds the chunk position t.
    """

    kill_sandbox: list[str] = field(
        default_factory=list
    )  # "i:t": SIGKILL rollout i's sandbox while chunk t is written
    foreign_identity: list[int] = field(
        default_factory=list
    )  # rollout i sends one call under another trajectory's path
    # "i:t": rollout i's worker process exits while chunk t is written (Ray restarts the actor)
    kill_worker: list[str] = field(default_factory=list)


@dataclass
class RolloutConfig:
    num_workers: int = 8  # Ray actors (threads when use_ray=false), each running rollouts_per_worker
    use_ray: bool = True  # false: threads in the driver (debugging); the same worker code either way
    num_cpus_per_worker: float = 0.25  # Ray CPU reservation per worker (workers mostly wait on HTTP)
    # rollouts one worker runs at once, on threads (Ray's max_concurrency): num_workers x this are in
    # flight. Each Ray worker is a process whose start-up costs a few CPU seconds, so fewer workers
    # running several rollouts each start faster on a small box
    rollouts_per_worker: int = 1
    # Ray custom resources per worker, e.g. {rollout: 1}: workers go only to nodes started with that
    # resource (`ray start --resources='{"rollout": 64}'`), away from the engines' nodes
    ray_resources: dict[str, float] = field(default_factory=dict)
    spread_workers: bool = False  # Ray SPREAD: workers over every node (the default packs a node first)
    # a worker process that dies (OOM kill, segfault in a framework) is replaced by a new actor up to this
    # many times per slot; the rollout it was running ends as a platform_error (rollout/lost_worker_rollouts)
    max_worker_restarts: int = 3
    mode: str = "train"  # train | rollout_only (collect + dump, no update) | train_only (replay dumps)
    dump: bool = False  # write each step's train items to <run>/dumps/step_<k>.pt (replayable)
    keep_rollout_dirs: bool = False  # keep every step's rollout banks (debugging; disk heavy)
    faults: FaultConfig = field(default_factory=FaultConfig)  # fault injection (chaos tests); off by default

    def validate(self) -> None:
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"rollout.mode={self.mode!r}: want train, rollout_only or train_only")
        if self.num_workers < 1:
            raise ValueError("rollout.num_workers must be >= 1")
        if self.rollouts_per_worker < 1:
            raise ValueError(f"rollout.rollouts_per_worker={self.rollouts_per_worker}: must be >= 1")
        if self.max_worker_restarts < 0:
            raise ValueError(f"rollout.max_worker_restarts={self.max_worker_restarts}: must be >= 0")
        if any(v <= 0 for v in self.ray_resources.values()):
            raise ValueError(f"rollout.ray_resources={dict(self.ray_resources)}: every amount must be > 0")
