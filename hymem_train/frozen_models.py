"""The frozen reader and judge an RL stage serves itself, and the reward clients pointed at them.

Where they run: a pool of replicas where cluster.placement.<role>.replicas > 0 (placement.json says
where), else the CPU box's in-process reader (`local_reader`; `reader_kind=extractive` serves the
extractive instrument); otherwise reward.<role>.base_url is used as given. The stage's config is never
rewritten: `start_frozen_models` returns the reward config with the served addresses in it.
`start_reward` is what the RL stage calls: the servers, the reader preflight, and the reward service
over them, each handed to `stage.on_close`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hymem_train.gateway.local_reader import start_frozen_pool, start_frozen_server, start_instrument_server
from hymem_train.run_config import RlConfig
from hymem_train.stage import Stage, write_placement
from reward.config import RewardConfig
from reward.harness_rewards import HarnessRewards
from reward.judge import Reader
from reward.llm import ChatClient
from reward.reader_checks import preflight_to


def frozen_roles(cfg: RlConfig) -> list[tuple[str, Any, bool]]:
    """(role, model, in-process) of the frozen models the stage may serve. A pool asked for without a
    checkpoint is refused here, at run time, not in RlConfig.validate: the full-size configs name no
    reader / judge checkpoint (the report does not), and `hymem_train.plan` sizes their pools without one."""
    roles = [("reader", cfg.reader_model, cfg.local_reader)]
    if cfg.reward.judge_kind == "llm":
        roles.append(("judge", cfg.judge_model, False))
    for role, model, _ in roles:
        if (n := getattr(cfg.cluster.placement, role).replicas) and not model.path:
            raise ValueError(
                f"cluster.placement.{role}.replicas={n}: the stage serves the {role} itself, so "
                f"{role}_model.path must name its checkpoint"
            )
    return roles


def start_frozen_models(stage: Stage, cfg: RlConfig) -> tuple[list[Any], RewardConfig]:
    """The servers started (stop them at the end) and cfg.reward with each served role's address."""
    from hymem_train.models.loading import load_tokenizer_for  # transformers: the driver only

    started: list[Any] = []
    served: dict[str, Any] = {}
    try:
        for role, model, local in frozen_roles(cfg):
            client = getattr(cfg.reward, role)
            if getattr(cfg.cluster.placement, role).replicas:
                srv = start_frozen_pool(
                    role,
                    model,
                    load_tokenizer_for(model),
                    served_model_name=client.model,
                    engine_cfg=cfg.engine,
                    cluster=cfg.cluster,
                    host=cfg.gateway.host,
                    export_dir=stage.run_dir / f"{role}_hf",
                )
                write_placement(stage, stage.run_dir, **{role: srv.infos, f"{role}_gateway": srv.base_url})
            # an instrument reader (no model): reader_model unused
            elif local and role == "reader" and cfg.reader_kind != "model":
                srv = start_instrument_server(
                    stage.tokenizer,
                    served_model_name=client.model,
                    max_model_len=cfg.engine.max_model_len,
                    host=cfg.gateway.host,
                    kind=cfg.reader_kind,
                )
            elif local:  # CPU boxes: the frozen reader in this process
                srv = start_frozen_server(
                    model,
                    stage.tokenizer,
                    served_model_name=client.model,
                    max_model_len=cfg.engine.max_model_len,
                    host=cfg.gateway.host,
                )
            else:
                continue
            started.append(srv)
            served[role] = dataclasses.replace(client, base_url=srv.base_url)
    except BaseException:
        for srv in started:
            srv.stop()
        raise
    return started, dataclasses.replace(cfg.reward, **served)


def reader_preflight(stage: Stage, cfg: RlConfig, reward: RewardConfig) -> None:
    """On ledger-world training data: does the reader the rewards use read the bank? The four figures
    go to <run_dir>/reader_preflight.json and the log; a failed check stops the stage before step 0
    (reward.reader_checks)."""

    datasets = {h: stage.dataset.of(h) for h in cfg.harnesses}
    preflight_to(
        stage.run_dir / "reader_preflight.json",
        datasets,
        Reader(ChatClient(reward.reader)),
        search_k=reward.search_k,
        echo=lambda s: print(s, flush=True),
    )


def start_reward(stage: Stage, cfg: RlConfig) -> HarnessRewards:
    """(driver) The frozen servers, the reader preflight (when `cfg.reader_preflight`) and the reward
    service that scores with them; `stage.close` stops the service, then the servers."""
    servers, reward_cfg = start_frozen_models(stage, cfg)
    stage.on_close.extend(srv.stop for srv in servers)
    stage.reward_reader = reward_cfg.reader  # the swap evaluation's reader, too
    if cfg.reader_preflight:
        reader_preflight(stage, cfg, reward_cfg)
    reward = HarnessRewards(reward_cfg, stage.bank_readers, stage.dataset.manifests)
    stage.on_close.append(reward.shutdown)
    return reward
