"""The Segment: one LLM call a harness made during one write.

Token-in/token-out: a Segment holds the exact token ids the engine consumed and produced, so the
trainer never re-tokenizes text (re-tokenizing drifts at merge boundaries and silently changes the
sampled sequence whose logprobs the importance ratio uses).

Legend: P = prompt tokens, R = response tokens, L = MoE layers, K = experts per token (top-k).
`routed_experts_TLK` covers T = P + R positions (prompt then response) in the layout vLLM's
`return_routed_experts` uses. The engine never forwards the last sampled token, so its row is the
sentinel -1 ("do not replay"), and so is any position an engine did not route.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FINISH_REASONS = ("stop", "length")
NOT_ROUTED = -1  # sentinel: position that must not be replayed (see models/routing.py)


@dataclass
class Segment:
    trajectory_id: str  # rollout identity the gateway credential maps to
    chunk_index: int  # sequence-level Chunk.index (data_pipeline.schema) this call served (silent failure chunk-unmapped)
    call_index: int  # order of this call within the chunk's write
    prompt_ids: list[int]  # exact ids fed to the engine (chat template applied by the gateway)
    response_ids: list[int]  # exact ids the engine sampled, EOS included when it stopped
    logprobs: list[float]  # sampling logprob of each response id under the rollout policy
    finish_reason: str  # "stop" | "length"
    routed_experts_TLK: np.ndarray | None = None  # int16 [P+R, L, K] or None (dense / not captured)
    bank_id: str = ""  # bank the trajectory writes into (identity check, silent failure shared-identity)
    policy_version: int = 0  # weight version that produced the tokens (weight sync counter)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.response_ids):
            raise ValueError(
                f"segment {self.trajectory_id}/{self.chunk_index}/{self.call_index}: "
                f"{len(self.logprobs)} logprobs for {len(self.response_ids)} response tokens"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"segment finish_reason {self.finish_reason!r} not in {FINISH_REASONS}")
        if self.routed_experts_TLK is not None:
            r = np.asarray(self.routed_experts_TLK)
            if r.ndim != 3 or r.shape[0] != self.num_tokens:
                raise ValueError(
                    f"segment {self.trajectory_id}/{self.chunk_index}/{self.call_index}: routed experts "
                    f"shape {tuple(r.shape)} does not align with {self.num_tokens} tokens (want [T, L, K])"
                )
            self.routed_experts_TLK = r.astype(np.int16, copy=False)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def input_ids(self) -> list[int]:
        return list(self.prompt_ids) + list(self.response_ids)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.routed_experts_TLK is not None:
            d["routed_experts_TLK"] = self.routed_experts_TLK.tolist()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Segment:
        d = dict(d)
        if d.get("routed_experts_TLK") is not None:
            d["routed_experts_TLK"] = np.asarray(d["routed_experts_TLK"], dtype=np.int16)
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())
