"""Serve the policy behind the OpenAI-compatible gateway.

    python -m hymem_train.serve +exp=demo_cpu gateway.port=8000

Prints the base URL and the admin token (to register trajectories over HTTP), then serves until
interrupted. Rollout workers in the same process use `Gateway.register/set_chunk` directly.
"""

from __future__ import annotations

import logging
import time

import hydra
from omegaconf import DictConfig

from hymem_train.config import CONFIG_DIR, to_typed
from hymem_train.engines import build_engine
from hymem_train.gateway import Gateway, GatewayServer
from hymem_train.models.loading import load_tokenizer_for
from hymem_train.run_config import ServeConfig

log = logging.getLogger(__name__)


def build_gateway(cfg: ServeConfig) -> Gateway:
    tokenizer = load_tokenizer_for(cfg.model)
    engine = build_engine(cfg.engine, cfg.model, tokenizer)
    return Gateway(engine, tokenizer, cfg.gateway)


@hydra.main(config_path=CONFIG_DIR, config_name="serve", version_base=None)
def main(dcfg: DictConfig) -> None:
    cfg = to_typed(dcfg, ServeConfig)
    gateway = build_gateway(cfg)
    with GatewayServer(gateway) as server:
        log.info("gateway on %s (model %r)", server.base_url, cfg.gateway.served_model_name)
        print(f"base_url={server.base_url} admin_token={gateway.admin_token}", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
