"""The engine a stage serves from: in the driver process, or a pool of Ray actor replicas."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from hymem_train.engines.base import Engine
from hymem_train.engines.config import EngineConfig
from hymem_train.engines.factory import build_engine
from hymem_train.engines.vllm_engine import SERVING_KEYS
from hymem_train.models.checkpoint_files import checkpoint_kind
from hymem_train.models.config import ModelConfig


def build_served_engine(cfg: EngineConfig, model_cfg, tokenizer, *, replicas: int, cluster) -> Engine:
    """The engine a stage serves from: in this process (`replicas` = 0, a CPU box's default) or a pool of
    `replicas` Ray actors placed by cluster.placement (engines/replicas.py): `tensor_parallel_size`
    GPUs each on a GPU cluster, `cpus_per_replica` CPUs each on a CPU one."""
    if replicas == 0:
        return build_engine(cfg, model_cfg, tokenizer)
    from hymem_train.engines.replicas import ReplicaPool  # Ray: only for a pool

    pl = cluster.placement
    gpus = cfg.tensor_parallel_size if cluster.num_gpus_per_node else 0
    return ReplicaPool(
        cfg,
        model_cfg,
        tokenizer,
        replicas,
        cpus_per_replica=pl.cpus_per_replica,
        gpus_per_replica=gpus,
        strategy=pl.replica_strategy,
        weight_backend="nccl" if gpus else "gloo",
    )


def engine_model_cfg(
    engine_kind: str, model_cfg: ModelConfig, out: Path, fallback_model: ModelConfig | None = None
) -> ModelConfig:
    """The model config an engine loads. vLLM reads only HF directories with its HYV3 keys, so it gets an
    export at `out` (written once) of: a step checkpoint (the report's RL from OPD step 375), an HF
    directory a plain `save_pretrained` wrote, or, for a model without a path, the preset's initial
    weights (the stage's first weight sync replaces them with the trainer's). The trainer and the HF
    engine read the original."""
    if engine_kind != "vllm":
        return model_cfg
    # torch: only when a vLLM engine needs an export
    from hymem_train.trainer.export import export_checkpoint

    if model_cfg.path and checkpoint_kind(model_cfg.path) != "deepspeed":
        on_disk = json.loads((Path(model_cfg.path) / "config.json").read_text())
        if all(k in on_disk for k in SERVING_KEYS):
            return model_cfg
    if not (out / "config.json").exists():
        if model_cfg.path:
            export_checkpoint(model_cfg.path, out, dtype=model_cfg.dtype, fallback_model=fallback_model)
        else:
            from hymem_train.models.loading import load_model, load_tokenizer_for
            from hymem_train.trainer.export import CardInfo, _live_tensors, write_hf_dir

            model = load_model(model_cfg)
            write_hf_dir(
                _live_tensors(model, 2**28),
                model.config,
                out,
                dtype=None,
                tokenizer=load_tokenizer_for(model_cfg),
                card=CardInfo(source="initial weights"),
            )
    return dataclasses.replace(model_cfg, path=str(out))
