"""Reward configs: the frozen reader/judge endpoints (LlmClientConfig) and the reward service
(RewardConfig). No Ray or HTTP client import here, so config schemas stay light."""

from __future__ import annotations

from dataclasses import dataclass

from reward.scoring import ScoringConfig

JUDGE_KINDS = ("llm", "exact_match")


@dataclass
class LlmClientConfig:
    """One OpenAI-compatible endpoint serving a frozen model (reader or judge)."""

    base_url: str  # e.g. http://127.0.0.1:8001/v1 (vLLM or the HF engine's server)
    model: str  # model name sent with every request
    api_key: str = "EMPTY"  # vLLM and the HF engine accept any key unless started with one
    timeout_s: float = 60.0  # per request; a timeout is a platform fault (retried)
    num_retries: int = 2  # extra attempts after the first, per item
    retry_backoff_s: float = 0.5  # sleep before retry k is retry_backoff_s * 2**k
    max_concurrency: int = 32  # requests in flight at once; 1 = one at a time
    max_tokens: int = 256  # response budget per call
    temperature: float = 0.0  # frozen scorer: greedy, so a rescoring gives the same verdict
    json_mode: bool = False  # send response_format={"type":"json_object"} (vLLM guided decoding)

    def validate(self) -> None:
        if self.num_retries < 0 or self.max_concurrency < 1 or self.timeout_s <= 0:
            raise ValueError(
                f"llm client {self.model}: need num_retries >= 0, max_concurrency >= 1, timeout_s > 0"
            )


@dataclass
class RewardConfig:
    """The reward service: scoring math, the frozen reader and judge, and the actor pool."""

    scoring: ScoringConfig  # weights and ablation switches
    reader: LlmClientConfig  # frozen answer model endpoint
    judge: LlmClientConfig  # frozen judge endpoint (unused when judge_kind = exact_match)
    judge_kind: str = "llm"  # "llm" | "exact_match" (synthetic answers_atomic datasets only)
    search_k: int = 10  # memories retrieved per probe / question through the harness's own search
    num_actors: int = 2  # reward actors in the pool (each scores one rollout at a time)
    num_cpus_per_actor: float = 0.5  # Ray CPU reservation per actor (bank search + HTTP; light)

    def validate(self) -> None:
        self.scoring.validate()
        self.reader.validate()
        self.judge.validate()
        if self.judge_kind not in JUDGE_KINDS:
            raise ValueError(f"reward config: judge_kind={self.judge_kind!r} not in {JUDGE_KINDS}")
        if self.search_k < 1 or self.num_actors < 1:
            raise ValueError("reward config: search_k and num_actors must be >= 1")
