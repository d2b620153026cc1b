"""EngineConfig: the inference engine's knobs (imports nothing heavy, so config schemas stay light)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    kind: str = "hf"  # "hf" (transformers, CPU or one GPU) | "vllm" (GPU clusters; CPU: docs/vllm.md)
    max_model_len: int = 4096  # prompt + response tokens accepted; the report: 28,672 + 4,096
    max_batch_size: int = 16  # requests per batched forward (hf); vLLM schedules its own
    capture_routes: bool = True  # record routed experts per token (MoE routing replay)
    seed: int = 0  # engine sampling seed for requests without their own
    tensor_parallel_size: int = 1  # vllm only
    gpu_memory_utilization: float = 0.85  # vllm only
    # vllm only: the most log-probs per position vLLM returns (its own default, 20, is under the
    # teacher's top-50); OPD refuses a teacher engine below opd.teacher_top_k
    max_logprobs: int = 64
    enable_prefix_caching: bool = True  # vllm only; dropped after every weight sync
    # vllm only: AsyncLLM, every gateway request joins the running engine (continuous batching); false:
    # the offline LLM behind the gateway's static batcher (docs/vllm.md, the gateway benchmark)
    async_engine: bool = True
    # vllm only: sleep mode (set by the stage under cluster.placement.mode=colocated, not by hand)
    enable_sleep_mode: bool = False
    enforce_eager: bool = False  # vllm only: no torch.compile / CUDA graphs (CPU tests: a 33-s warm-up saved)

    def validate(self) -> None:
        if self.kind not in ("hf", "vllm"):
            raise ValueError(f"engine.kind must be 'hf' or 'vllm', got {self.kind!r}")
        if self.max_logprobs < 1:
            raise ValueError(f"engine.max_logprobs={self.max_logprobs}: must be >= 1")
        if self.max_model_len < 2 or self.max_batch_size < 1:
            raise ValueError("engine.max_model_len must be >= 2 and engine.max_batch_size >= 1")
