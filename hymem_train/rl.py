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

import hydra
from omegaconf import DictConfig

from hymem_train.callbacks.plots import CurvePlot
from hymem_train.config import CONFIG_DIR, to_typed
from hymem_train.gateway.local_reader import start_frozen_server
from hymem_train.heldout import rl_chunk_reward
from hymem_train.rollout.collector import sum_rollout_metrics
from hymem_train.run_config import RlConfig
from hymem_train.stage import Stage, build_stage, log_step
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


def train(stage: Stage, reward: HarnessRewards | None, cfg: RlConfig) -> dict[str, float]:
    """The RL loop, one optimizer step per iteration. Returns the last step's metrics."""
    timer, is_driver = stage.timer, stage.is_driver
    harness, G = next(iter(cfg.harnesses)), cfg.rl.num_rollouts_per_window

    def evaluate(step: int) -> dict[str, float]:
        return rl_chunk_reward(
            stage.collector,
            stage.eval_dataset,
            harness,
            reward,
            cfg.rl.num_eval_rollouts,
            step,
            cfg.reward.scoring.report_protocol(),
        )

    if is_driver and stage.eval_dataset is not None and stage.start_step == 0:
        log_step(stage, 0, evaluate(0))
    last: dict[str, float] = {}
    timer.mark()
    for step in range(stage.start_step + 1, cfg.num_steps + 1):
        items, m, done = None, {}, []
        if is_driver and cfg.rollout.mode == "train_only":  # replay a dumped rollout batch
            items = stage.dumps.load(step)
        elif is_driver:
            # 1. rollouts: G per window, each from its own fork of the window's parent bank
            windows = stage.scheduler.next_windows(cfg.rl.num_windows_per_step)
            with timer("rollout"):
                groups = stage.collector.collect(windows, G, step)
            stage.callbacks.on_rollouts(step, groups)
            # 2. score every chunk of every rollout: s[t], then A[i, t] per chunk column
            with timer("reward"):
                scored = reward.score_groups([g.reward_group(stage.dataset) for g in groups])
            # 3. train items: every call of chunk t of rollout i gets A[i, t]
            items = advantage_items(groups, scored, cfg.trainer.loss.sequence_unit)
            # 4. the rollout with the highest sum of chunk scores carries the bank on (report); a window
            #    with no valid rollout is retried next step from the same parent
            for g, res in zip(groups, scored, strict=True):
                if res.best_rollout is not None:
                    stage.collector.promote(g, res.best_rollout)
                    done.append(g.scheduled)
            m = {**sum_rollout_metrics(groups), **reduce_group_metrics(scored)}
            m["rollout/windows_done"] = float(len(done))
            if cfg.rollout.dump:
                stage.dumps.save(step, items)
        # 5. PPO on every rank, then push the weights to the rollout engine
        items = stage.trainer.broadcast(items) or []
        if cfg.rollout.mode != "rollout_only" and items:
            with timer("train"):
                m.update(stage.trainer.train_items(items, "ppo"))
            with timer("sync"):
                m.update(stage.trainer.sync_weights(stage.sync_receivers, step))
        # 6. advance the windows that finished, evaluate, checkpoint, log
        if is_driver:
            stage.scheduler.advance(done)
            stage.collector.clean(step)
            if stage.eval_dataset is not None and (step % cfg.save_every == 0 or step == cfg.num_steps):
                with timer("eval"):
                    m.update(evaluate(step))
        with timer("checkpoint"):
            stage.checkpoints.maybe_save(step, stage.scheduler)
        m.update(timer.pop())
        log_step(stage, step, m)
        last = m
        if stage.preempted(step):  # checkpointed: a requeued job resumes after this step
            return last
    export_hf(stage.trainer, cfg.model, stage.run_dir / "final")
    if is_driver:
        stage.callbacks.on_train_end()
    return last


def run(cfg: RlConfig) -> dict[str, float]:
    stage = build_stage(cfg, growth_bounds=cfg.reward.scoring.growth_bounds)
    reader = reward = None
    failed = True
    try:
        if stage.is_driver:
            if cfg.local_reader:  # CPU boxes: the frozen reader in this process
                reader = start_frozen_server(
                    cfg.reader_model, stage.tokenizer, served_model_name=cfg.reward.reader.model,
                    max_model_len=cfg.engine.max_model_len,
                )  # fmt: skip
                cfg.reward.reader = dataclasses.replace(cfg.reward.reader, base_url=reader.base_url)
            reward = HarnessRewards(cfg.reward, stage.bank_readers, stage.dataset.manifests)
            stage.callbacks.callbacks.append(CurvePlot(stage.logger, CURVES, "rl_curves.png"))
        last = train(stage, reward, cfg)
        failed = False
    finally:
        if reward is not None:
            reward.shutdown()
        if reader is not None:
            reader.stop()
        stage.close(failed=failed)
    return last


@hydra.main(config_path=CONFIG_DIR, config_name="rl", version_base=None)
def main(dcfg: DictConfig) -> None:
    run(to_typed(dcfg, RlConfig))


if __name__ == "__main__":
    main()
