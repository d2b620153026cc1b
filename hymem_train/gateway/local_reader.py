"""A frozen model served behind a frozen-mode gateway in this process: on CPU boxes the RL reader
(`local_reader=true`) runs here instead of at a vLLM endpoint."""

from __future__ import annotations

from hymem_train.engines import build_engine
from hymem_train.engines.config import EngineConfig
from hymem_train.gateway.config import GatewayConfig
from hymem_train.gateway.runner import GatewayServer
from hymem_train.gateway.server import Gateway
from hymem_train.models.config import ModelConfig


def start_frozen_server(
    model: ModelConfig, tokenizer, *, served_model_name: str, max_model_len: int
) -> GatewayServer:
    """The frozen model behind an HF engine (no route capture, no identities, no segments, no
    embeddings); the caller points its client at `server.base_url` and stops the server."""
    engine = build_engine(EngineConfig(capture_routes=False, max_model_len=max_model_len), model, tokenizer)
    gateway = Gateway(
        engine, tokenizer, GatewayConfig(frozen=True, embeddings=False, served_model_name=served_model_name)
    )
    return GatewayServer(gateway).start()
