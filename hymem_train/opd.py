"""Stage 1: On-Policy Distillation (report section OPD).

    python -m hymem_train.opd +exp=demo_cpu                     # tiny models, native harness, CPU
    sbatch slurm/ray_job.sbatch hymem_train.opd +exp=hy_memory_opd

Each step: the student writes windows inside the harnesses (2 rollouts per row); the frozen teacher
scores every segment the student sampled (top-50 log-probs per position); the student minimises the
reverse KL over the teacher's support (+ entropy bonus); weights sync to the rollout engine.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from hymem_train.callbacks.plots import CurvePlot
from hymem_train.config import CONFIG_DIR, to_typed
from hymem_train.engines.serving import build_served_engine, engine_model_cfg
from hymem_train.heldout import opd_reverse_kl
from hymem_train.rollout.collector import sum_rollout_metrics
from hymem_train.run_config import OpdConfig
from hymem_train.stage import Stage, build_stage, end_run, end_step, log_step, write_placement
from hymem_train.trainer.items import teacher_items

log = logging.getLogger(__name__)

CURVES = [
    "distill/reverse_kl_topk",
    "eval/reverse_kl",
    "eval/reverse_kl_sampled",
    "distill/teacher_token_coverage",
    "distill/entropy",
]


def train(stage: Stage, teacher, cfg: OpdConfig) -> dict[str, float]:
    """The OPD loop, one optimizer step per iteration. Returns the last step's metrics."""
    timer, is_driver = stage.timer, stage.is_driver
    harness = next(iter(cfg.harnesses))  # held-out KL in the first declared harness

    def evaluate(step: int) -> dict[str, float]:
        return opd_reverse_kl(
            stage.collector,
            stage.eval_dataset,
            harness,
            stage.engine,
            teacher,
            step,
            stage.trainer.model.config.vocab_size,
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
            # 1. rollouts: 2 per data row, each from its own fork of the row's parent bank
            windows = stage.scheduler.next_windows(cfg.opd.num_rows_per_step)
            stage.callbacks.on_rollouts_start(step)
            with timer("rollout"):
                groups = stage.collector.collect(windows, cfg.opd.num_rollouts_per_row, step)
            stage.callbacks.on_rollouts(step, groups)
            # 2. the teacher's top-k over every segment the student sampled
            with timer("teacher"):
                items = teacher_items(groups, teacher, cfg.opd.teacher_top_k)
            m = sum_rollout_metrics(groups)
            # 3. no reward in OPD: each row's first rollout not failed by the platform carries the bank on
            firsts = [u[0][0] if (u := g.usable()) else None for g in groups]
            done = stage.collector.carry_forward(groups, firsts)
            m["rollout/windows_done"] = float(len(done))
            if cfg.rollout.dump:
                stage.dumps.save(step, items)
        # 4. train on every rank, then push the weights to the rollout engine
        items = stage.trainer.broadcast(items) or []
        if cfg.rollout.mode != "rollout_only" and items:
            m.update(stage.sleep_engine())
            with timer("train"):
                m.update(stage.trainer.train_items(items, "opd"))
            m.update(stage.wake_engine())
            with timer("sync"):
                m.update(stage.trainer.sync_weights(stage.sync_receivers, step))
            # the loss is the truncated reverse KL minus the entropy bonus: log the KL itself
            m["distill/reverse_kl_topk"] = (
                m["train/loss"] + cfg.trainer.loss.entropy_coef * m["distill/entropy"]
            )
        # 5. advance the windows that finished, evaluate, checkpoint, log
        if is_driver:
            stage.scheduler.advance(done)
        last = m
        if end_step(stage, step, m, evaluate):  # preempted: a requeued job resumes after this step
            return last
    end_run(stage)
    return last


def run(cfg: OpdConfig) -> dict[str, float]:
    stage = build_stage(cfg)
    failed, teacher = True, None
    try:
        if stage.is_driver:
            teacher_model = engine_model_cfg(
                cfg.teacher_engine.kind, cfg.teacher, stage.run_dir / "teacher_hf"
            )
            teacher = build_served_engine(
                cfg.teacher_engine,
                teacher_model,
                stage.tokenizer,
                replicas=cfg.cluster.placement.teacher_replicas,
                cluster=cfg.cluster,
            )
            if hasattr(teacher, "shutdown"):  # a pool of replica actors
                stage.on_close.append(teacher.shutdown)
            write_placement(stage, stage.run_dir, teacher=getattr(teacher, "infos", "driver"))
            stage.callbacks.callbacks.append(CurvePlot(stage.logger, CURVES, "opd_curves.png"))
        last = train(stage, teacher, cfg)
        failed = False
    finally:
        stage.close(failed=failed)  # the teacher's replicas first
    return last


@hydra.main(config_path=CONFIG_DIR, config_name="opd", version_base=None)
def main(dcfg: DictConfig) -> None:
    run(to_typed(dcfg, OpdConfig))


if __name__ == "__main__":
    main()
