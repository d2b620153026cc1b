"""Stage 2: attributed memory RL with chunk-level GRPO (report section RL).

    python -m hymem_train.rl +exp=demo_rl init_checkpoint=runs/demo/opd/final
    sbatch slurm/ray_job.sbatch hymem_train.rl +exp=hy_memory_rl

Each step: 8 rollouts per window from independent copies of the parent bank; the reward service
scores every chunk (probes + traps after each chunk, gold-fact attributed ORM after the window, the
growth penalty) into chunk-level GRPO advantages; the best rollout's bank is promoted; PPO (no KL)
with routing replay updates the policy; weights sync to the rollout engine.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import hydra
from omegaconf import DictConfig

from hymem_train.callbacks.plots import CurvePlot
from hymem_train.config import CONFIG_DIR, to_typed
from hymem_train.gateway.local_reader import start_frozen_pool, start_frozen_server, start_instrument_server
from hymem_train.heldout import rl_chunk_reward
from hymem_train.rollout.collector import WindowRollouts, sum_rollout_metrics
from hymem_train.run_config import RlConfig
from hymem_train.stage import Stage, build_stage, end_step, log_step, write_placement
from hymem_train.trainer.export import export_hf
from hymem_train.trainer.items import advantage_items
from reward.harness_rewards import HarnessRewards, reduce_group_metrics

log = logging.getLogger(__name__)

CURVES = [
    "reward/s",
    "reward/prm",
    "reward/orm",
    "reward/pen",
    "eval/s",
    "train/clipfrac",
    "train/clipfrac_low",
    "train/clipfrac_high",
    "reward/zero_advantage_share",
]


@dataclass
class Batch:
    """One step's rollouts, scored and turned into train items (driver)."""

    step: int
    groups: list[WindowRollouts]
    scored: list[Any]  # reward.harness_rewards results, one per group
    items: list[Any]  # trainer items, every call of chunk t of rollout i carrying A[i, t]
    seconds: dict[str, float]  # phase -> seconds: rollout, reward
    span: tuple[float, float]  # perf_counter() when collection began and ended


def collect(stage: Stage, reward: HarnessRewards, cfg: RlConfig, step: int) -> Batch:
    """Steps 1-3 of the loop for `step`, in whichever thread runs it (rl.overlap_rollout: a background
    thread while the previous step trains). Reads the scheduler, never advances it."""
    t0 = time.perf_counter()
    # 1. rollouts: G per window, each from its own fork of the window's parent bank
    windows = stage.scheduler.next_windows(cfg.rl.num_windows_per_step)
    stage.callbacks.on_rollouts_start(step)
    groups = stage.collector.collect(windows, cfg.rl.num_rollouts_per_window, step)
    stage.callbacks.on_rollouts(step, groups)
    t1 = time.perf_counter()
    # 2. score every chunk of every rollout: s[t], then A[i, t] per chunk column
    scored = reward.score_groups([g.reward_group(stage.dataset) for g in groups])
    # 3. train items: every call of chunk t of rollout i gets A[i, t]
    items = advantage_items(groups, scored, cfg.trainer.loss.sequence_unit)
    t2 = time.perf_counter()
    return Batch(step, groups, scored, items, {"rollout": t1 - t0, "reward": t2 - t1}, (t0, t2))


def policy_lag(items: list[Any], weights_version: int) -> dict[str, float]:
    """How many weight versions the sampling policy trailed the one being trained, measured from the
    version the engine stamped on every segment (0 = on-policy; 1 under rl.overlap_rollout)."""
    lags = [weights_version - it.segment.policy_version for it in items]
    if not lags:
        return {}
    return {"rollout/policy_lag_max": float(max(lags)), "rollout/policy_lag_mean": sum(lags) / len(lags)}


def train(stage: Stage, reward: HarnessRewards | None, cfg: RlConfig) -> dict[str, float]:
    """The RL loop, one optimizer step per iteration. Returns the last step's metrics.

    rl.overlap_rollout (off by default; the report is synchronous): once step k's batch is scored and
    its banks promoted, step k+1's batch is collected in a background thread while step k trains, and
    waited for before step k's weights sync, so the engine never changes weights mid-rollout and every
    batch is exactly one version stale. The PPO ratio against the engine's log-probs sees the lag."""
    timer, is_driver = stage.timer, stage.is_driver

    def evaluate(step: int) -> dict[str, float]:
        return rl_chunk_reward(
            stage.collector,
            stage.eval_dataset,
            next(iter(cfg.harnesses)),
            reward,
            cfg.rl.num_eval_rollouts,
            step,
            cfg.reward.scoring.report_protocol(),
        )

    if is_driver and stage.eval_dataset is not None and stage.start_step == 0:
        log_step(stage, 0, evaluate(0))
    last: dict[str, float] = {}
    overlap = cfg.rl.overlap_rollout and is_driver
    background = ThreadPoolExecutor(1, thread_name_prefix="overlapped-rollout") if overlap else None
    pending: Future | None = None  # step k+1's batch, being collected while step k trains
    ready: Batch | None = None  # step k+1's batch, collected; step k+1 trains on it
    timer.mark()
    try:
        for step in range(stage.start_step + 1, cfg.num_steps + 1):
            items, m, done = None, {}, []
            if is_driver and cfg.rollout.mode == "train_only":  # replay a dumped rollout batch
                items = stage.dumps.load(step)
            elif is_driver:
                if ready is None:  # collected now, on this step's clock
                    batch = collect(stage, reward, cfg, step)
                    for phase, seconds in batch.seconds.items():
                        timer.add(phase, seconds)
                else:  # collected while the previous step trained (its wait is on that step's clock)
                    batch, ready = ready, None
                # 4. the rollout with the highest sum of chunk scores carries the bank on (report); a
                #    window with no valid rollout is retried next step from the same parent
                for g, res in zip(batch.groups, batch.scored, strict=True):
                    if res.best_rollout is not None:
                        stage.collector.promote(g, res.best_rollout)
                        done.append(g.scheduled)
                m = {**sum_rollout_metrics(batch.groups), **reduce_group_metrics(batch.scored)}
                m["rollout/windows_done"] = float(len(done))
                # the weights this step trains were synced as version step - 1
                m.update(policy_lag(batch.items, step - 1))
                # the finished windows advance now: the next step's windows are drawn from here
                stage.scheduler.advance(done)
                items = batch.items
                if cfg.rollout.dump:
                    stage.dumps.save(step, items)
                if background is not None and step < cfg.num_steps:
                    pending = background.submit(collect, stage, reward, cfg, step + 1)
            # 5. PPO on every rank, then push the weights to the rollout engine
            items = stage.trainer.broadcast(items) or []
            trained = (0.0, 0.0)
            if cfg.rollout.mode != "rollout_only" and items:
                m.update(stage.sleep_engine())
                with timer("train"):
                    t0 = time.perf_counter()
                    m.update(stage.trainer.train_items(items, "ppo"))
                    trained = (t0, time.perf_counter())
            if pending is not None:  # the engine keeps its weights until the next batch is in
                with timer("rollout"):
                    ready, pending = pending.result(), None
                m.update(overlap_metrics(ready, trained))
            if cfg.rollout.mode != "rollout_only" and items:
                m.update(stage.wake_engine())
                with timer("sync"):
                    m.update(stage.trainer.sync_weights(stage.sync_receivers, step))
            # 6. evaluate, checkpoint, log
            last = m
            if end_step(stage, step, m, evaluate):  # preempted: a requeued job resumes after this step
                if ready is not None:  # collected for a step this job will not train: dropped
                    stage.collector.clean(ready.step)
                return last
    finally:
        if background is not None:
            background.shutdown(wait=True, cancel_futures=True)
    export_hf(stage.trainer, cfg.model, stage.run_dir / "final")
    if is_driver:
        stage.callbacks.on_train_end()
    return last


def overlap_metrics(batch: Batch, trained: tuple[float, float]) -> dict[str, float]:
    """The next step's collection, run in the background during this step: its phases' seconds and
    how many of them the training hid (`overlap/hidden_s`)."""
    (b0, b1), (t0, t1) = batch.span, trained
    return {
        "overlap/next_rollout_s": batch.seconds["rollout"],
        "overlap/next_reward_s": batch.seconds["reward"],
        "overlap/hidden_s": max(0.0, min(b1, t1) - max(b0, t0)),
    }


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


def start_frozen_models(stage: Stage, cfg: RlConfig) -> list[Any]:
    """The frozen reader and judge the stage serves itself, and the reward clients pointed at them:
    a pool of replicas where cluster.placement.<role>.replicas > 0 (placement.json says where), else
    the CPU box's in-process reader (`local_reader`); otherwise reward.<role>.base_url is used as given."""
    from hymem_train.models.loading import load_tokenizer_for

    started: list[Any] = []
    roles = frozen_roles(cfg)
    try:
        for role, model, local in roles:
            client = getattr(cfg.reward, role)
            if getattr(cfg.cluster.placement, role).replicas:
                srv = start_frozen_pool(
                    role, model, load_tokenizer_for(model), served_model_name=client.model, engine_cfg=cfg.engine,
                    cluster=cfg.cluster, host=cfg.gateway.host, export_dir=stage.run_dir / f"{role}_hf",
                )  # fmt: skip
                write_placement(stage, stage.run_dir, **{role: srv.infos, f"{role}_gateway": srv.base_url})
            elif local and role == "reader" and cfg.reader_kind == "extractive":  # reader_model unused
                srv = start_instrument_server(stage.tokenizer, served_model_name=client.model,
                                              max_model_len=cfg.engine.max_model_len, host=cfg.gateway.host)  # fmt: skip
            elif local:  # CPU boxes: the frozen reader in this process
                srv = start_frozen_server(model, stage.tokenizer, served_model_name=client.model,
                                          max_model_len=cfg.engine.max_model_len, host=cfg.gateway.host)  # fmt: skip
            else:
                continue
            started.append(srv)
            setattr(cfg.reward, role, dataclasses.replace(client, base_url=srv.base_url))
    except BaseException:
        for srv in started:
            srv.stop()
        raise
    return started


def reader_preflight(stage: Stage, cfg: RlConfig) -> None:
    """On ledger-world training data: does the reader the rewards use read the bank? The four figures
    go to <run_dir>/reader_preflight.json and the log; a failed check stops the stage before step 0
    (reward.reader_checks)."""
    from reward.judge import Reader
    from reward.llm import ChatClient
    from reward.reader_checks import preflight_to

    datasets = {h: stage.dataset.of(h) for h in cfg.harnesses}
    preflight_to(stage.run_dir / "reader_preflight.json", datasets, Reader(ChatClient(cfg.reward.reader)),
                 search_k=cfg.reward.search_k, echo=lambda s: print(s, flush=True))  # fmt: skip


def run(cfg: RlConfig) -> dict[str, float]:
    stage = build_stage(cfg, growth_bounds=cfg.reward.scoring.growth_bounds)
    reward = None
    frozen: list[Any] = []  # the reader / judge servers this stage started
    failed = True
    try:
        if stage.is_driver:
            frozen = start_frozen_models(stage, cfg)
            if cfg.reader_preflight:
                reader_preflight(stage, cfg)
            reward = HarnessRewards(cfg.reward, stage.bank_readers, stage.dataset.manifests)
            stage.callbacks.callbacks.append(CurvePlot(stage.logger, CURVES, "rl_curves.png"))
        last = train(stage, reward, cfg)
        failed = False
    finally:
        if reward is not None:
            reward.shutdown()
        for server in frozen:
            server.stop()
        stage.close(failed=failed)
    return last


@hydra.main(config_path=CONFIG_DIR, config_name="rl", version_base=None)
def main(dcfg: DictConfig) -> None:
    run(to_typed(dcfg, RlConfig))


if __name__ == "__main__":
    main()
