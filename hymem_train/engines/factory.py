"""`build_engine`: the configured engine (HF on CPU or one GPU, vLLM on GPU clusters) for a model."""

from __future__ import annotations

from hymem_train.engines.base import Engine
from hymem_train.engines.config import EngineConfig
from hymem_train.engines.vllm_engine import VLLMEngine


def build_engine(cfg: EngineConfig, model_cfg, tokenizer) -> Engine:
    """Build the configured engine for `model_cfg` (models.ModelConfig)."""
    from hymem_train.models.loading import load_model

    cfg.validate()
    eos = [tokenizer.eos_token_id]
    if cfg.kind == "vllm":
        if not model_cfg.path:
            raise ValueError("engine.kind=vllm needs model.path (a local HF checkpoint directory)")
        return VLLMEngine(
            model_cfg.path,
            eos,
            max_model_len=cfg.max_model_len,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            capture_routes=cfg.capture_routes,
            seed=cfg.seed,
            max_logprobs=cfg.max_logprobs,
            enable_prefix_caching=cfg.enable_prefix_caching,
            enforce_eager=cfg.enforce_eager,
            enable_sleep_mode=cfg.enable_sleep_mode,
            async_engine=cfg.async_engine,
            dtype=model_cfg.dtype,
        )
    from hymem_train.engines.hf import HFEngine

    return HFEngine(
        load_model(model_cfg),
        eos,
        tokenizer.pad_token_id,
        max_model_len=cfg.max_model_len,
        max_batch_size=cfg.max_batch_size,
        capture_routes=cfg.capture_routes,
        seed=cfg.seed,
    )
