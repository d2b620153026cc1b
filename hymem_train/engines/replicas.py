"""Engine replicas as Ray actors, behind the one `Engine` interface (docs/cluster.md).

`ReplicaPool` is what the gateway and the weight sync see in the driver; each `EngineReplica` actor
builds the configured engine (HF on CPU, vLLM on GPU with `tensor_parallel_size` GPUs) wherever its
placement-group bundle lands, so replicas can sit on other nodes. A batch is split into contiguous
slices, one per replica, sent at once and put back in order: requests carry their own sampling seed,
so which replica serves a request does not change its tokens (its logprobs move by fp32 rounding only, as
in any other batch composition).

Weights reach the replicas over a weight-update group (trainer/weight_group.py): the pool opens it on
the first sync, the replicas receive while trainer rank 0 broadcasts; `weight_names` follows the engine
kind (vLLM loads the on-disk per-expert names).
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import logging
import os
import socket
from collections.abc import Iterable
from typing import Any

import ray
import torch

from hymem_train.engines.base import GenerationOutput, SamplingParams, TopKLogprobs
from hymem_train.engines.factory import build_engine
from hymem_train.trainer.weight_group import WeightBroadcaster, open_weight_group, receive_weights

log = logging.getLogger(__name__)

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_SPREAD", "STRICT_PACK")


class EngineReplica:
    """One engine in its own process (a Ray actor)."""

    def __init__(self, engine_cfg: Any, model_cfg: Any, tokenizer: Any):
        torch.set_num_threads(max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1))))
        self.engine = build_engine(engine_cfg, model_cfg, tokenizer)
        self.group = None

    def info(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()

        return {
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "max_model_len": self.engine.max_model_len,
            "policy_version": self.engine.policy_version,
        }

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        return self.engine.generate(prompts, params)

    def topk_logprobs(self, sequences: list[list[int]], k: int) -> list[TopKLogprobs]:
        return self.engine.topk_logprobs(sequences, k)

    def token_logprobs(self, sequences: list[list[int]]) -> list:
        return self.engine.token_logprobs(sequences)

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> int:
        return self.engine.update_weights(named_tensors, version)

    def sleep(self) -> int:
        return self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def join_weight_group(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        self.group = open_weight_group(host, port, rank, world_size, backend)

    def receive_weights(self) -> dict[str, float]:
        if self.group is None:
            raise RuntimeError("receive_weights before join_weight_group")
        return receive_weights(self.group, self.engine)


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) slices of n items over at most `parts` replicas, none empty."""
    parts = max(1, min(parts, n))
    q, r = divmod(n, parts)
    out, s = [], 0
    for i in range(parts):
        e = s + q + (i < r)
        out.append((s, e))
        s = e
    return out


class ReplicaPool:
    """N engine replicas behind the `Engine` interface; the caller owns `ray.init()`."""

    def __init__(
        self,
        engine_cfg: Any,
        model_cfg: Any,
        tokenizer: Any,
        num_replicas: int,
        *,
        cpus_per_replica: float = 1.0,
        gpus_per_replica: int = 0,
        strategy: str = "SPREAD",
        weight_backend: str = "gloo",
        ready_timeout_s: float = 600.0,
    ):
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if num_replicas < 1:
            raise ValueError(f"engine replicas: num_replicas={num_replicas}, want >= 1")
        if strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"engine replicas: strategy={strategy!r} not in {PLACEMENT_STRATEGIES}")
        if not ray.is_initialized():
            raise RuntimeError("ReplicaPool: call ray.init() first (hymem_train.cluster.init_ray)")
        bundle = {"CPU": cpus_per_replica, **({"GPU": gpus_per_replica} if gpus_per_replica else {})}
        self.pg = placement_group([dict(bundle) for _ in range(num_replicas)], strategy=strategy)
        if not self.pg.wait(timeout_seconds=ready_timeout_s):
            ray.util.remove_placement_group(self.pg)
            raise RuntimeError(
                f"engine replicas: {num_replicas} x {bundle} ({strategy}) could not be placed within "
                f"{ready_timeout_s:.0f} s; cluster resources: {ray.cluster_resources()}"
            )
        # vLLM's async engine batches continuously inside each replica: the gateway hands the pool each
        # request as it arrives (`submit`) and a replica actor runs that many calls at once
        self.continuous_batching = engine_cfg.kind == "vllm" and bool(
            getattr(engine_cfg, "async_engine", False)
        )
        self._turn = itertools.count()
        actor = ray.remote(EngineReplica)
        self.replicas = [
            actor.options(
                num_cpus=cpus_per_replica,
                num_gpus=gpus_per_replica,
                max_concurrency=1024 if self.continuous_batching else 1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
            ).remote(engine_cfg, model_cfg, tokenizer)
            for i in range(num_replicas)
        ]
        self.infos = ray.get([r.info.remote() for r in self.replicas], timeout=ready_timeout_s)
        self.max_model_len = min(i["max_model_len"] for i in self.infos)
        self.policy_version = self.infos[0]["policy_version"]
        self.weight_names = "serving" if engine_cfg.kind == "vllm" else "hf"
        self._backend, self._broadcaster, self._receiving = weight_backend, None, None
        log.info("engine replicas: %s", [(i["node_ip"], i["node_id"][:8], i["pid"]) for i in self.infos])

    # ---- the Engine interface --------------------------------------------------------------------
    def _fan_out(self, method: str, n: int, per_item: tuple[list, ...], *args) -> list:
        """`method` on every replica with its slice of each per-item list; results in request order."""
        if n == 0:
            return []
        refs = [
            getattr(self.replicas[i], method).remote(*(x[s:e] for x in per_item), *args)
            for i, (s, e) in enumerate(_split(n, len(self.replicas)))
        ]
        return [x for part in ray.get(refs) for x in part]

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        return self._fan_out("generate", len(prompts), (prompts, params))

    def submit(self, prompt: list[int], params: SamplingParams) -> cf.Future:
        """One request to the next replica in turn, as it arrives; a future of its GenerationOutput.
        Round robin, not sticky: the rollouts of one window may land on different replicas' prefix caches."""
        ref = self.replicas[next(self._turn) % len(self.replicas)].generate.remote([prompt], [params])
        out: cf.Future = cf.Future()

        def done(f: cf.Future) -> None:
            try:
                out.set_result(f.result()[0])
            except BaseException as e:  # the gateway sees the replica's error, never hangs
                out.set_exception(e)

        ref.future().add_done_callback(done)
        return out

    def topk_logprobs(self, sequences: list[list[int]], k: int) -> list[TopKLogprobs]:
        return self._fan_out("topk_logprobs", len(sequences), (sequences,), k)

    def token_logprobs(self, sequences: list[list[int]]) -> list:
        return self._fan_out("token_logprobs", len(sequences), (sequences,))

    def sleep(self) -> int:
        """Colocated placement: every replica releases its weights; the bytes released, summed."""
        return sum(ray.get([r.sleep.remote() for r in self.replicas]))

    def wake_up(self) -> None:
        ray.get([r.wake_up.remote() for r in self.replicas])

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """One bucket of a sync: the first one opens the group (once) and starts every replica receiving."""
        if self._broadcaster is None:
            self._open_group()
        if self._receiving is None:
            self._receiving = [r.receive_weights.remote() for r in self.replicas]
        return self._broadcaster.update_weights(named_tensors, version)

    def finish_sync(self, version: int) -> None:
        if self._receiving is None:  # a sync with no bucket: nothing was started
            return
        self._broadcaster.finish_sync(version)
        stats = ray.get(self._receiving)
        self._receiving = None
        self.policy_version = version
        log.info(
            "weight sync v%d: %d replicas, %.3f s on the slowest",
            version,
            len(stats),
            max(s["seconds"] for s in stats),
        )

    def _open_group(self) -> None:
        host = ray.util.get_node_ip_address()  # the driver's routable address: replicas may be elsewhere
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        world = len(self.replicas) + 1
        joins = [
            r.join_weight_group.remote(host, port, i + 1, world, self._backend)
            for i, r in enumerate(self.replicas)
        ]
        group = open_weight_group(host, port, 0, world, self._backend)  # returns once every replica joined
        ray.get(joins)
        self._broadcaster = WeightBroadcaster(group, self.weight_names)

    def node_ids(self) -> list[str]:
        return [i["node_id"] for i in self.infos]

    def shutdown(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for r in self.replicas:
            ray.kill(r)
        self.replicas = []
        remove_placement_group(self.pg)
