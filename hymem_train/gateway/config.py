"""GatewayConfig: the OpenAI-compatible gateway's knobs (no fastapi import here)."""

from __future__ import annotations

from dataclasses import dataclass

OVER_CAP_ACTIONS = ("drop_chunk", "truncate_left")


@dataclass
class GatewayConfig:
    # bind address; sandboxes reach it over loopback. "auto": the driver node's routable IP (Ray's view),
    # for rollout workers on other nodes
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port (tests, demo)
    served_model_name: str = "policy"  # the `model` field clients must send
    max_batch_size: int = 16  # requests per batched engine call
    batch_wait_ms: float = 10.0  # how long the batcher waits to fill a batch
    default_max_tokens: int = 256  # when the request gives no max_tokens
    embeddings: bool = True  # serve /v1/embeddings with the local MiniLM
    admin_token: str = ""  # required in X-Admin-Token for /admin/*; empty = a random one per process
    frozen: bool = False  # a frozen model (reader / judge / teacher): any key, no identity, no segments
    seed: int = 0  # run seed mixed into per-call sampling seeds (requests without their own seed)
    # context budgets per LLM call (report: 28,672 prompt + 4,096 response tokens); 0 = off, then
    # only prompt + max_tokens <= engine.max_model_len is enforced
    max_prompt_tokens: int = 0  # prompt cap; a prompt over it is counted (gateway/prompt_over_cap) and logged
    max_response_tokens: int = 0  # response budget: a request's max_tokens is clamped to it (counted)
    # what a prompt over the cap gets: "drop_chunk" (refused, HTTP 400 prompt_over_cap; the rollout
    # ends as a platform_error, docs/glossary.md) or "truncate_left" (its oldest tokens are cut)
    prompt_over_cap: str = "drop_chunk"

    def validate(self) -> None:
        if self.max_prompt_tokens < 0 or self.max_response_tokens < 0:
            raise ValueError(
                f"gateway.max_prompt_tokens={self.max_prompt_tokens}, gateway.max_response_tokens="
                f"{self.max_response_tokens}: must be >= 0 (0 = off)"
            )
        if self.prompt_over_cap not in OVER_CAP_ACTIONS:
            raise ValueError(
                f"gateway.prompt_over_cap={self.prompt_over_cap!r}: want one of {OVER_CAP_ACTIONS}"
            )

    def check_fits(self, max_model_len: int) -> None:
        """The two budgets must fit the engine's context together."""
        if self.max_prompt_tokens and self.max_response_tokens:
            total = self.max_prompt_tokens + self.max_response_tokens
            if total > max_model_len:
                raise ValueError(
                    f"gateway.max_prompt_tokens {self.max_prompt_tokens} + gateway.max_response_tokens "
                    f"{self.max_response_tokens} = {total} exceed engine.max_model_len {max_model_len}"
                )
