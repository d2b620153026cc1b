"""The composition root of a training stage: `build_stage(cfg)` builds every part from the config and
returns them in a `Stage`, which holds parts and has no behaviour. The step loop that uses them is
written out in `opd.py` and `rl.py`.

One driver process (rank 0) owns the rollout side: the policy engine behind the gateway, the window
scheduler, bank lineage, the rollout collector (Ray actors, or threads with rollout.use_ray=false)
and the metrics log. Under torchrun every rank trains: rank 0 collects a step's train items and
broadcasts them, and every rank trains on its share (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from data_pipeline.stats import REPORT_COLUMNS, format_table, of_tables
from harnesses.base import Endpoint
from hymem_train.callbacks import Callbacks
from hymem_train.callbacks.bank_sizes import BankSizeLog
from hymem_train.callbacks.dumps import StepDumps
from hymem_train.callbacks.gateway_counters import GatewayCounterDeltas
from hymem_train.callbacks.step_profile import StepProfileReport
from hymem_train.checkpointing import StageCheckpoints
from hymem_train.cluster import check_ray_capacity, init_ray
from hymem_train.config import to_yaml
from hymem_train.logger import MetricsLogger, StepTimer
from hymem_train.preemption import Preemption
from hymem_train.rollout.harness_factory import BankReaderFactory
from hymem_train.run_config import StageConfig

if TYPE_CHECKING:  # annotations only: each of these pulls torch, Ray or transformers
    from transformers import PreTrainedTokenizerBase

    from data_pipeline.store import BuiltDataset, HarnessDatasets
    from hymem_train.engines.base import Engine
    from hymem_train.engines.replicas import ReplicaPool
    from hymem_train.gateway.runner import GatewayServer
    from hymem_train.gateway.server import Gateway
    from hymem_train.rollout.collector import RolloutCollector
    from hymem_train.rollout.harness_factory import BankReaderFactory
    from hymem_train.rollout.scheduler import WindowScheduler
    from hymem_train.trainer.engine import Trainer
    from reward.config import LlmClientConfig
    from reward.scoring import GrowthBounds

log = logging.getLogger(__name__)


@dataclass
class Stage:
    """The parts of a running stage. Fields marked (driver) are None on ranks other than 0."""

    cfg: StageConfig
    run_dir: Path
    tokenizer: PreTrainedTokenizerBase
    trainer: Trainer  # DeepSpeed; every rank
    checkpoints: StageCheckpoints
    start_step: int  # the last finished step of a resumed run (0 = a new run)
    dataset: HarnessDatasets  # each harness's training windows (`.of(harness)`)
    eval_dataset: BuiltDataset | None  # held out (None: data.eval_path empty)
    timer: StepTimer
    dumps: StepDumps
    # (driver) the rollout policy engine (one engine, or a pool of replicas); weights arrive only by sync
    engine: Engine | ReplicaPool | None = None
    gateway: Gateway | None = None  # (driver) in front of the engine
    server: GatewayServer | None = None  # (driver) its HTTP server
    bank_readers: dict[str, BankReaderFactory] = field(default_factory=dict)  # (driver) per harness name
    scheduler: WindowScheduler | None = None  # (driver)
    collector: RolloutCollector | None = None  # (driver)
    logger: MetricsLogger | None = None  # (driver)
    callbacks: Callbacks = field(default_factory=lambda: Callbacks([]))  # (driver) side jobs
    preemption: Preemption | None = None  # every rank: checkpoint and leave on request
    # (driver, RL) the reward's reader as reached, served by the stage or given
    reward_reader: LlmClientConfig | None = None
    # what an entry point started for this stage (a teacher, the frozen servers): `close` stops them,
    # last first, before the stage's own parts
    on_close: list[Callable[[], None]] = field(default_factory=list)

    @property
    def is_driver(self) -> bool:
        return self.trainer.rank == 0

    def preempted(self, step: int) -> bool:
        """Collective, after step `step` is logged: on a preemption request, checkpoint it and say so
        (the loop then returns without exporting). The last step just finishes."""
        if step == self.cfg.num_steps:
            self.preemption.done()
            return False
        if not self.preemption.requested():
            return False
        self.checkpoints.maybe_save(step, self.scheduler, force=True)
        self.preemption.stopped(step)
        return True

    def sleep_engine(self) -> dict[str, float]:
        """(driver) Colocated placement: the policy engine releases its weights while the trainer steps
        (they share the GPUs); `wake_engine` before the sync, which sends every weight back."""
        if self.cfg.cluster.placement.mode != "colocated" or self.engine is None:
            return {}
        return {"perf/engine_freed_gb": self.engine.sleep() / 1e9}

    def wake_engine(self) -> dict[str, float]:
        if self.cfg.cluster.placement.mode != "colocated" or self.engine is None:
            return {}
        t0 = time.perf_counter()
        self.engine.wake_up()
        return {"perf/time_wake_s": time.perf_counter() - t0}

    @property
    def sync_receivers(self) -> list:
        """Where the weight sync sends the trained weights: the driver's engine."""
        return [self.engine] if self.engine is not None else []

    def close(self, failed: bool = False) -> None:
        """`failed`: this rank is leaving on an exception; its peers may not reach a barrier."""
        while self.on_close:
            self.on_close.pop()()
        if self.collector is not None and self.collector.pool is not None:
            self.collector.pool.shutdown()
        if self.server is not None:
            self.server.stop()
        if hasattr(self.engine, "shutdown"):  # a pool of replica actors
            self.engine.shutdown()
        if self.logger is not None:
            self.logger.finish()
        self.trainer.close(barrier=not failed)


def build_stage(cfg: StageConfig, *, growth_bounds: dict[str, GrowthBounds] | None = None) -> Stage:
    """Every part of a stage, built in a fixed order (the RNG draws of model init depend on it)."""
    import torch

    from data_pipeline.store import BuiltDataset, HarnessDatasets
    from hymem_train.engines.serving import build_served_engine, engine_model_cfg
    from hymem_train.gateway.runner import GatewayServer
    from hymem_train.gateway.server import Gateway
    from hymem_train.models.loading import load_tokenizer_for, require_local_dir
    from hymem_train.rollout.collector import RolloutCollector
    from hymem_train.rollout.lineage import BankLineage
    from hymem_train.rollout.pool import RolloutPool
    from hymem_train.rollout.scheduler import ScheduleError, WindowScheduler
    from hymem_train.trainer.engine import Trainer, load_trainer_model

    run_dir = Path(cfg.run.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    tokenizer = load_tokenizer_for(cfg.model)
    # init_checkpoint: an HF directory or a DeepSpeed step checkpoint (models/loading.py reads both)
    if cfg.init_checkpoint:
        require_local_dir(cfg.init_checkpoint, "init_checkpoint")
    model_cfg = dataclasses.replace(cfg.model, path=cfg.init_checkpoint or cfg.model.path)
    # the trainer's model and the engine's are separate copies: weights reach the engine only
    # through the bucketed weight sync, as they do across machines
    trainer = Trainer(cfg.trainer, load_trainer_model(model_cfg, cfg.trainer))
    log.info("trainer rank %d of %d on host %s", trainer.rank, trainer.world_size, socket.gethostname())
    checkpoints = StageCheckpoints(trainer, run_dir, save_every=cfg.save_every, num_steps=cfg.num_steps)
    start_step, client_state = checkpoints.resume()
    if start_step:
        log.info("resumed from %s at step %d", checkpoints.dir, start_step)
    datasets = HarnessDatasets.from_config(
        cfg.data.path, cfg.data.per_harness, list(cfg.harnesses), keep_leaked=cfg.data.keep_leaked
    )
    stage = Stage(
        cfg,
        run_dir,
        tokenizer,
        trainer,
        checkpoints,
        start_step,
        datasets,
        BuiltDataset(cfg.data.eval_path, keep_leaked=cfg.data.keep_leaked) if cfg.data.eval_path else None,
        StepTimer(),
        StepDumps(run_dir),
    )
    stage.preemption = Preemption(run_dir, trainer, is_driver=stage.is_driver)
    if stage.is_driver:
        init_ray(cfg.cluster)
        # colocated: the engine sleeps while the trainer steps (Stage.sleep_engine); vLLM must be told at start
        colocated = cfg.cluster.placement.mode == "colocated"
        stage.engine = build_served_engine(
            dataclasses.replace(cfg.engine, enable_sleep_mode=colocated),
            engine_model_cfg(cfg.engine.kind, model_cfg, run_dir / "init_hf", cfg.model),
            tokenizer,
            replicas=cfg.cluster.placement.policy_replicas,
            cluster=cfg.cluster,
        )
        stage.gateway = Gateway(stage.engine, tokenizer, cfg.gateway)
        stage.server = GatewayServer(stage.gateway).start()
        # bank readers (reward actors, lineage checks) embed queries through the gateway under an
        # identity of their own that never declares a chunk, so it can never record a segment
        embedder = Endpoint(
            stage.server.base_url, stage.gateway.register("bank-readers", bank_id="*"), "all-MiniLM-L6-v2"
        )
        stage.bank_readers = {
            name: BankReaderFactory(h, run_dir, embedder) for name, h in cfg.harnesses.items()
        }
        stage.scheduler = WindowScheduler(
            stage.dataset.schedule(), list(cfg.harnesses), run_dir, growth_bounds=growth_bounds
        )
        log_data_table(stage.dataset, run_dir)
        if "scheduler" in client_state:  # the cursor that belongs to the loaded checkpoint
            stage.scheduler.restore(client_state["scheduler"])
        elif start_step == 0:  # no checkpoint yet: a killed first step's cursor must not skip its windows
            stage.scheduler.start_over()
        else:
            raise ScheduleError(
                f"{checkpoints.dir}: the checkpoint of step {start_step} holds no window scheduler cursor (not "
                "written by a training stage); use a new run.output_dir"
            )
        lineage = BankLineage(run_dir, lambda name: stage.bank_readers[name]())
        pool = None
        if cfg.rollout.mode != "train_only":
            check_ray_capacity(cfg)
            worker_kwargs = dict(
                harnesses=cfg.harnesses,
                gateway_url=stage.server.url,
                admin_token=stage.gateway.admin_token,
                model_name=cfg.gateway.served_model_name,
                tokenizer_path=cfg.model.tokenizer_path,
                faults=cfg.rollout.faults,
            )
            pool = RolloutPool(
                worker_kwargs,
                cfg.rollout.num_workers,
                use_ray=cfg.rollout.use_ray,
                num_cpus_per_worker=cfg.rollout.num_cpus_per_worker,
                resources=cfg.rollout.ray_resources,
                spread=cfg.rollout.spread_workers,
                max_restarts=cfg.rollout.max_worker_restarts,
                on_lost=stage.gateway.forget,
                rollouts_per_worker=cfg.rollout.rollouts_per_worker,
            )
        stage.collector = RolloutCollector(
            pool, stage.dataset, lineage, run_dir, keep_rollout_dirs=cfg.rollout.keep_rollout_dirs
        )
        stage.logger = MetricsLogger(
            cfg.logging, run_dir, cfg.run.name, config=dataclasses.asdict(cfg), resume=start_step > 0
        )
        stage.logger.restore(start_step, client_state.get("step_metrics"))
        stage.callbacks = Callbacks(
            [BankSizeLog(run_dir), GatewayCounterDeltas(stage.gateway), StepProfileReport(run_dir)]
        )
        if cfg.swap_eval.every:  # after the counter deltas: its calls show up in the next step's deltas
            from hymem_train.callbacks.swap_eval import SwapEval

            stage.callbacks.callbacks.append(SwapEval(stage))
        write_placement(stage, run_dir)
    # collective (ZeRO-3 gathers every shard): every rank, not only the one that owns the engine
    trainer.sync_weights(stage.sync_receivers, version=start_step)
    torch.manual_seed(cfg.run.seed + start_step)
    return stage


def write_placement(stage: Stage, run_dir: Path, **extra: Any) -> dict:
    """Where the driver-side parts run (`<run>/placement.json`): the driver, the gateway's address, the
    policy engine (or its replicas) and the rollout workers, each with its Ray node; `extra`: more parts."""
    import ray

    def here() -> dict:
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }

    path = run_dir / "placement.json"
    out = json.loads(path.read_text()) if extra and path.exists() else {}
    if not extra:
        pool = stage.collector.pool if stage.collector is not None else None
        out = {
            "driver": here(),
            "gateway": stage.server.url,
            "policy": getattr(stage.engine, "infos", None) or [here()],
            "rollout_workers": pool.placement() if pool is not None else [],
        }
    out.update(extra)
    path.write_text(json.dumps(out, indent=1))
    return out


def log_data_table(datasets: HarnessDatasets, run_dir: Path) -> str:
    """The reward-data statistics of what the stage trains on, one row per harness configuration in the
    report's layout; logged at start-up and written to `<run>/data_stats.md`. Under the data.path
    shorthand every row is the whole shared dataset (its sequences are split over the harnesses)."""
    rows = [of_tables(h, d.tables) for h, d in datasets.by_harness.items()]
    note = "\n\n(data.path shorthand: one dataset, sequences bound to harnesses round-robin)\n"
    table = format_table(rows, REPORT_COLUMNS) + (note if datasets.round_robin else "\n")
    (run_dir / "data_stats.md").write_text(table)
    log.info("reward data per harness:\n%s", table)
    return table


def end_step(
    stage: Stage, step: int, m: dict[str, float], evaluate: Callable[[int], dict[str, float]]
) -> bool:
    """The tail of every stage step: (driver) drop the step's rollout banks and evaluate on the
    eval_every schedule; (every rank) checkpoint, log. Returns whether a preemption request stopped the
    job here (the step is checkpointed; the loop returns without exporting)."""
    cfg, timer = stage.cfg, stage.timer
    if stage.is_driver:
        stage.collector.clean(step)
        if stage.eval_dataset is not None and cfg.evaluates_at(step):
            with timer("eval"):
                m.update(evaluate(step))
    with timer("checkpoint"):
        stage.checkpoints.maybe_save(step, stage.scheduler, metrics=m if stage.is_driver else None)
    m.update(timer.pop())
    log_step(stage, step, m)
    return stage.preempted(step)


def end_run(stage: Stage) -> None:
    """After the last step (every rank): the HF export `<run>/final` (the next stage's init_checkpoint,
    the evaluation's writer), then the callbacks' end of training."""
    from hymem_train.trainer.export import export_hf

    export_hf(stage.trainer, stage.cfg.model, stage.run_dir / "final")
    if stage.is_driver:
        stage.callbacks.on_train_end()


def log_step(stage: Stage, step: int, metrics: dict[str, float]) -> None:
    """Driver: the step's side-job metrics (callbacks), then the metrics log (the first and the last
    step reach wandb and the console whatever logging.log_every says)."""
    if stage.is_driver:
        stage.callbacks.on_step_end(step, metrics)
        stage.logger.log(step, metrics, force=step in (0, stage.start_step + 1, stage.cfg.num_steps))
