"""The engine a stage serves from: in the driver process, or a pool of Ray actor replicas."""

from __future__ import annotations

from hymem_train.engines.base import Engine
from hymem_train.engines.config import EngineConfig
from hymem_train.engines.factory import build_engine


def build_served_engine(cfg: EngineConfig, model_cfg, tokenizer, *, replicas: int, cluster) -> Engine:
    """The engine a stage serves from: in this process (`replicas` = 0, a CPU box's default) or a pool of
    `replicas` Ray actors placed by cluster.placement (engines/replicas.py): `tensor_parallel_size`
    GPUs each on a GPU cluster, `cpus_per_replica` CPUs each on a CPU one."""
    if replicas == 0:
        return build_engine(cfg, model_cfg, tokenizer)
    from hymem_train.engines.replicas import ReplicaPool  # Ray: only for a pool

    pl = cluster.placement
    gpus = cfg.tensor_parallel_size if cluster.num_gpus_per_node else 0
    return ReplicaPool(cfg, model_cfg, tokenizer, replicas, cpus_per_replica=pl.cpus_per_replica,
                       gpus_per_replica=gpus, strategy=pl.replica_strategy,
                       weight_backend="nccl" if gpus else "gloo")  # fmt: skip
