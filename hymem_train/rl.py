"""Stage 2: attributed memory RL with chunk-level GRPO (report section RL).

    python -m hymem_train.rl +exp=demo_rl init_checkpoint=runs/demo/opd/final
    sbatch slurm/ray_job.sbatch hymem_train.rl +exp=hy_memory_rl

Each step: 8 rollouts per window from independent copies of the parent bank; the reward service
scores every chunk (probes + traps after each chunk, gold-fact attributed ORM after the window, the
growth penalty) into chunk-level GRPO advantages; the best rollout's bank is promoted; PPO (no KL)
with routing replay updates the policy; weights sync to the rollout engine.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from hymem_train.callbacks.plots import CurvePlot
from hymem_train.config import CONFIG_DIR, to_typed
from hymem_train.frozen_models import start_reward
from hymem_train.heldout import rl_chunk_reward
from hymem_train.rollout.collector import sum_rollout_metrics
from hymem_train.rollout.overlap import Batch, RolloutBatches, policy_lag, timed_batch
from hymem_train.run_config import RlConfig
from hymem_train.stage import Stage, build_stage, end_run, end_step, log_step
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


def collect(stage: Stage, reward: HarnessRewards, cfg: RlConfig, step: int) -> Batch:
    """Steps 1-3 of the loop for `step` (a background thread under rl.overlap_rollout)."""

    def rollouts():  # 1. G per window, each from its own fork of the window's parent bank
        windows = stage.scheduler.next_windows(cfg.rl.num_windows_per_step)
        stage.callbacks.on_rollouts_start(step)
        groups = stage.collector.collect(windows, cfg.rl.num_rollouts_per_window, step)
        stage.callbacks.on_rollouts(step, groups)
        return groups

    def score(groups):  # 2. s[t] for every chunk, A[i, t] per chunk column; 3. every call gets A[i, t]
        scored = reward.score_groups([g.reward_group(stage.dataset) for g in groups])
        return scored, advantage_items(groups, scored, cfg.trainer.loss.sequence_unit)

    return timed_batch(step, rollouts, score)


def train(stage: Stage, reward: HarnessRewards | None, cfg: RlConfig) -> dict[str, float]:
    """The RL loop, one optimizer step per iteration. Returns the last step's metrics."""
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
    batches = RolloutBatches(
        lambda k: collect(stage, reward, cfg, k), cfg.rl.overlap_rollout and is_driver, timer
    )
    timer.mark()
    try:
        for step in range(stage.start_step + 1, cfg.num_steps + 1):
            items, m, done = None, {}, []
            if is_driver and cfg.rollout.mode == "train_only":  # replay a dumped rollout batch
                items = stage.dumps.load(step)
            elif is_driver:
                batch = batches.take(step)
                # 4. the rollout with the highest sum of chunk scores carries the bank on (report); a
                #    window with no valid rollout is retried next step from the same parent
                done = stage.collector.carry_forward(batch.groups, [r.best_rollout for r in batch.scored])
                m = {**sum_rollout_metrics(batch.groups), **reduce_group_metrics(batch.scored)}
                m["rollout/windows_done"] = float(len(done))
                m.update(policy_lag(batch.items, step - 1))  # this step trains the weights synced as step - 1
                stage.scheduler.advance(done)  # the next step's windows are drawn from here
                items = batch.items
                if cfg.rollout.dump:
                    stage.dumps.save(step, items)
                if step < cfg.num_steps:
                    batches.prefetch(step + 1)
            # 5. PPO on every rank, then push the weights to the rollout engine
            items = stage.trainer.broadcast(items) or []
            trains = cfg.rollout.mode != "rollout_only" and bool(items)
            if trains:
                m.update(stage.sleep_engine())
                with timer("train"):
                    m.update(stage.trainer.train_items(items, "ppo"))
            m.update(batches.wait(timer.last("train")))  # how much of the next collection it hid
            if trains:
                m.update(stage.wake_engine())
                with timer("sync"):
                    m.update(stage.trainer.sync_weights(stage.sync_receivers, step))
            # 6. evaluate, checkpoint, log
            last = m
            if end_step(stage, step, m, evaluate):  # preempted: a requeued job resumes after this step
                batches.drop(stage.collector)
                return last
    finally:
        batches.close()
    end_run(stage)
    return last


def run(cfg: RlConfig) -> dict[str, float]:
    stage = build_stage(cfg, growth_bounds=cfg.reward.scoring.growth_bounds)
    failed = True
    try:
        reward = None
        if stage.is_driver:
            reward = start_reward(stage, cfg)
            stage.callbacks.callbacks.append(CurvePlot(stage.logger, CURVES, "rl_curves.png"))
        last = train(stage, reward, cfg)
        failed = False
    finally:
        stage.close(failed=failed)  # the reward service and the frozen servers first (start_reward)
    return last


@hydra.main(config_path=CONFIG_DIR, config_name="rl", version_base=None)
def main(dcfg: DictConfig) -> None:
    run(to_typed(dcfg, RlConfig))


if __name__ == "__main__":
    main()
