"""One inference-engine interface for the policy, the teacher and the frozen reader/judge.

Legend: P = prompt tokens, R = response tokens, T = scored positions, K = top-k (teacher support),
L = MoE layers, E = experts per token.

Logprobs are those of the *unprocessed* model distribution (temperature 1, no top-p), as vLLM's
default `raw_logprobs` mode returns them: that is the distribution the trainer recomputes, so PPO's
importance ratio compares like with like.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import torch


@dataclass
class SamplingParams:
    max_tokens: int = 256  # response budget; the report uses 4,096
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept
    top_k: int = 0  # 0 = off
    seed: int | None = None  # per-request sampling seed (reproducible rollouts)
    stop_token_ids: list[int] = field(default_factory=list)  # extra stop ids besides the tokenizer's EOS

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


@dataclass
class GenerationOutput:
    response_ids: list[int]  # sampled ids, the stop token included when finish_reason == "stop"
    logprobs: list[float]  # raw-model logprob of each sampled id
    finish_reason: str  # "stop" | "length"
    routed_experts_TLE: np.ndarray | None = None  # int16 [P+R, L, E]; last row -1 (never forwarded)
    # the weight version that sampled it, stamped by the engine that did (a replica of a pool may finish
    # its sync before the pool's own version moves); None: the caller reads engine.policy_version
    policy_version: int | None = None


@dataclass
class TopKLogprobs:
    """Teacher support at each position t: the top-K next-token ids and their logprobs."""

    ids_TK: torch.Tensor  # int64 [T, K]: position t predicts token t+1
    logprobs_TK: torch.Tensor  # float32 [T, K]


class PromptTooLongError(ValueError):
    """prompt + max_tokens exceeds the engine's context."""


@runtime_checkable
class Engine(Protocol):
    max_model_len: int  # prompt + response tokens the engine accepts
    policy_version: int  # bumped by every update_weights

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        """Sample one response per prompt (token ids in, token ids out)."""
        ...

    def topk_logprobs(self, sequences: list[list[int]], k: int) -> list[TopKLogprobs]:
        """Top-k next-token logprobs at every position of each sequence (OPD teacher)."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Load (name, tensor) pairs (one bucket of a weight sync); returns how many were loaded."""
        ...


def check_lengths(prompts: list[list[int]], params: list[SamplingParams], max_model_len: int) -> None:
    if len(prompts) != len(params):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        sp.validate()
        if not p:
            raise ValueError(f"prompt {i} is empty")
        if len(p) + sp.max_tokens > max_model_len:
            raise PromptTooLongError(
                f"prompt {i}: {len(p)} prompt tokens + max_tokens {sp.max_tokens} > max_model_len {max_model_len}"
            )
