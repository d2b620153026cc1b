"""A frozen model (the RL reader or judge, the evaluation's) served by the stage itself behind a
frozen-mode gateway: in this process on a CPU box (`local_reader=true`), or as the pool of engine
replicas that cluster.placement.reader / .judge asks for (Ray actors on their own GPUs, docs/cluster.md).
With `reader_kind=extractive` (or `lexical`) the reader is no model but an instrument
(reward.instrument, reward.lexical), behind the same frozen gateway."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from hymem_train.engines import build_engine
from hymem_train.engines.config import EngineConfig
from hymem_train.engines.instrument import InstrumentReaderEngine
from hymem_train.engines.serving import build_served_engine, engine_model_cfg
from hymem_train.gateway.config import GatewayConfig
from hymem_train.gateway.runner import GatewayServer
from hymem_train.gateway.server import Gateway
from hymem_train.models.config import ModelConfig

log = logging.getLogger(__name__)


def start_frozen_server(
    model: ModelConfig, tokenizer, *, served_model_name: str, max_model_len: int, host: str = "127.0.0.1"
) -> GatewayServer:
    """The frozen model behind an HF engine in this process (no route capture, no identities, no
    segments, no embeddings); the caller points its client at `server.base_url` and stops the server."""
    engine = build_engine(EngineConfig(capture_routes=False, max_model_len=max_model_len), model, tokenizer)
    return _serve(engine, tokenizer, served_model_name, host)


def start_instrument_server(
    tokenizer,
    *,
    served_model_name: str,
    max_model_len: int,
    host: str = "127.0.0.1",
    kind: str = "extractive",
) -> GatewayServer:
    """An instrument reader (`kind`: reader_kind extractive or lexical; no model) behind the same frozen
    gateway as `start_frozen_server`: the same client path, an answer extracted from the prompt's
    records. `tokenizer` applies the chat template and decodes the prompt."""
    engine = InstrumentReaderEngine(tokenizer, max_model_len=max_model_len, kind=kind)
    return _serve(engine, tokenizer, served_model_name, host)


def start_frozen_pool(
    role: str,
    model: ModelConfig,
    tokenizer,
    *,
    served_model_name: str,
    engine_cfg: EngineConfig,
    cluster: Any,
    host: str,
    export_dir: Path,
) -> FrozenPool:
    """`cluster.placement.<role>.replicas` replicas of the frozen model, of the policy's engine kind
    (vLLM on a GPU cluster, HF actors on a CPU one), each `tensor_parallel_size` GPUs, behind one
    frozen gateway in the driver that spreads each batch over them. `export_dir`: where a vLLM engine's
    loadable copy of a training checkpoint is written (engines/serving.py engine_model_cfg)."""
    pool = getattr(cluster.placement, role)
    cfg = dataclasses.replace(
        engine_cfg,
        capture_routes=False,
        max_model_len=pool.max_model_len,
        tensor_parallel_size=pool.tensor_parallel_size,
        gpu_memory_utilization=pool.gpu_memory_utilization,
    )
    engine = build_served_engine(
        cfg, engine_model_cfg(cfg.kind, model, export_dir), tokenizer, replicas=pool.replicas, cluster=cluster
    )
    try:
        server = _serve(engine, tokenizer, served_model_name, host)
    except BaseException:
        engine.shutdown()
        raise
    log.info("%s: %d %s replicas behind %s", role, pool.replicas, cfg.kind, server.base_url)
    return FrozenPool(server, engine)


class FrozenPool:
    """A frozen gateway and the replica pool behind it; `stop` ends both."""

    def __init__(self, server: GatewayServer, engine: Any):
        self.server, self.engine = server, engine
        self.base_url = server.base_url
        self.infos = engine.infos  # where each replica runs (placement.json)

    def stop(self) -> None:
        self.server.stop()
        self.engine.shutdown()


def _serve(engine, tokenizer, served_model_name: str, host: str) -> GatewayServer:
    gateway = Gateway(
        engine,
        tokenizer,
        GatewayConfig(host=host, frozen=True, embeddings=False, served_model_name=served_model_name),
    )
    return GatewayServer(gateway).start()
