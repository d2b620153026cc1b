"""GatewayConfig: the OpenAI-compatible gateway's knobs (no fastapi import here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GatewayConfig:
    host: str = "127.0.0.1"  # bind address; sandboxes reach it over loopback (or the cluster network)
    port: int = 0  # 0 = any free port (tests, demo)
    served_model_name: str = "policy"  # the `model` field clients must send
    max_batch_size: int = 16  # requests per batched engine call
    batch_wait_ms: float = 10.0  # how long the batcher waits to fill a batch
    default_max_tokens: int = 256  # when the request gives no max_tokens
    embeddings: bool = True  # serve /v1/embeddings with the local MiniLM
    admin_token: str = ""  # required in X-Admin-Token for /admin/*; empty = a random one per process
    frozen: bool = False  # a frozen model (reader / judge / teacher): any key, no identity, no segments
    seed: int = 0  # run seed mixed into per-call sampling seeds (requests without their own seed)
