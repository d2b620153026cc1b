"""What both stages share: the run directory, the policy engine behind the gateway, the trainer, the
data, the window scheduler, bank lineage, the rollout pool, logging, and resume.

One driver process runs the loop; rollouts run in Ray actors (threads with rollout.use_ray=false),
the reward in Ray actors, training in DeepSpeed. Under torchrun every rank runs the loop: rank 0
collects rollouts and builds the step's train items, then broadcasts them; all ranks train on their
share (trainer/packing.py gives every rank the same number of micro-batches).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnesses.base import Endpoint
from harnesses.registry import HarnessConfig
from hymem_train.config import ClusterConfig, LoggingConfig, RunConfig, to_yaml
from hymem_train.engines import EngineConfig, build_engine
from hymem_train.gateway.server import Gateway, GatewayConfig
from hymem_train.logger import MetricsLogger, StepTimer
from hymem_train.models.loading import ModelConfig, load_model, load_tokenizer_for
from hymem_train.rollout.harness_factory import BankReaderFactory
from hymem_train.rollout.lineage import BankLineage
from hymem_train.rollout.pool import RolloutPool
from hymem_train.rollout.scheduler import ScheduledWindow, WindowScheduler
from hymem_train.rollout.worker import FaultConfig, RolloutResult, RolloutTask
from hymem_train.trainer.engine import TrainerConfig
from reward.calibrate_growth import BANK_SIZES_FILE

log = logging.getLogger(__name__)


@dataclass
class RolloutConfig:
    num_workers: int = 8  # concurrent rollouts (Ray actors, or threads when use_ray=false)
    use_ray: bool = True  # false: threads in the driver (debugging); the same worker code either way
    num_cpus_per_worker: float = 0.25  # Ray CPU reservation per worker (workers mostly wait on HTTP)
    mode: str = "train"  # train | rollout_only (collect + dump, no update) | train_only (replay dumps)
    dump: bool = False  # write each step's train items to <run>/dumps/step_<k>.pt (replayable)
    keep_rollout_dirs: bool = False  # keep every step's rollout banks (debugging; disk heavy)
    faults: FaultConfig = field(default_factory=FaultConfig)  # fault injection (chaos tests); off by default

    def validate(self) -> None:
        if self.mode not in ("train", "rollout_only", "train_only"):
            raise ValueError(f"rollout.mode={self.mode!r}: want train, rollout_only or train_only")
        if self.num_workers < 1:
            raise ValueError("rollout.num_workers must be >= 1")


@dataclass
class DataRef:
    path: str = "???"  # a built dataset directory (python -m data_pipeline.build), one harness profile
    eval_path: str = ""  # held-out built dataset for evaluation ("" = none)


@dataclass
class StageConfig:
    """Fields both stages share; OpdStageConfig / RlStageConfig add theirs."""

    trainer: TrainerConfig  # configs/trainer/{opd,rl}.yaml
    model: ModelConfig = field(default_factory=ModelConfig)  # the policy (student)
    engine: EngineConfig = field(default_factory=EngineConfig)  # rollout engine behind the gateway
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    harnesses: dict[str, HarnessConfig] = field(
        default_factory=dict
    )  # the declared harness set (name -> config)
    data: DataRef = field(default_factory=DataRef)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    run: RunConfig = field(default_factory=RunConfig)
    num_steps: int = 100  # optimizer steps of this stage
    save_every: int = 10  # checkpoint every N steps (and at the end)
    init_checkpoint: str = ""  # HF checkpoint directory to start the policy from ("" = model config)

    def validate(self) -> None:
        self.model.validate(), self.engine.validate(), self.trainer.validate(), self.rollout.validate()
        self.cluster.validate(), self.logging.validate()
        if not self.harnesses:
            raise ValueError("harnesses: declare at least one harness configuration")
        for h in self.harnesses.values():
            h.validate()
        if self.num_steps < 1 or self.save_every < 1:
            raise ValueError("num_steps and save_every must be >= 1")


def ray_cpu_demand(cfg) -> float:
    """CPUs the stage's Ray actors reserve: rollout workers, plus the reward actors of every harness (RL)."""
    demand = cfg.rollout.num_workers * cfg.rollout.num_cpus_per_worker if cfg.rollout.use_ray else 0.0
    reward = getattr(cfg, "reward", None)
    if reward is not None:
        demand += len(cfg.harnesses) * reward.num_actors * reward.num_cpus_per_actor
    return demand


def check_ray_capacity(cfg) -> None:
    """A local Ray start with fewer CPUs than the actors reserve does not fail: the extra actors stay
    pending and the first step waits forever (seen: rollout.num_workers=16 on cluster.num_cpus=2).
    Say so up front. On a joined cluster the autoscaler may still add nodes, so only warn there."""
    import ray

    have = float(ray.cluster_resources().get("CPU", 0.0))
    need = ray_cpu_demand(cfg)
    if need <= have + 1e-9:
        return
    msg = (
        f"Ray actors reserve {need:g} CPUs (rollout.num_workers={cfg.rollout.num_workers} x "
        f"rollout.num_cpus_per_worker={cfg.rollout.num_cpus_per_worker}"
        + (" + reward actors" if getattr(cfg, "reward", None) is not None else "")
        + f") but the Ray cluster has {have:g}: the actors that do not fit would wait forever. Lower "
        "rollout.num_workers or rollout.num_cpus_per_worker, or raise cluster.num_cpus"
    )
    if cfg.cluster.ray_address == "local":
        raise ValueError(msg)
    log.warning(msg)


class Runtime:
    """Builds every part of a stage from its config; `close()` tears them down."""

    def __init__(self, cfg: StageConfig, *, growth_bounds: dict[str, Any] | None = None):
        import torch

        from data_pipeline.store import BuiltDataset
        from hymem_train.gateway.runner import GatewayServer
        from hymem_train.trainer.engine import Trainer

        self.cfg = cfg
        self.run_dir = Path(cfg.run.output_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
        self.timer = StepTimer()
        self.tokenizer = load_tokenizer_for(cfg.model)
        model_cfg = dataclasses.replace(cfg.model, path=cfg.init_checkpoint or cfg.model.path)
        # the trainer's model and the engine's are separate copies: weights reach the engine only
        # through the bucketed weight sync, as they do across machines
        self.trainer = Trainer(cfg.trainer, load_model(model_cfg))
        self.rank = self.trainer.rank
        self.world_size = self.trainer.world_size
        self.is_driver = self.rank == 0
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.start_step = 0
        self.client_state: dict[str, Any] = {}
        if (self.ckpt_dir / "latest").exists():  # resume: a kill loses no window (see scheduler/lineage)
            self.client_state = self.trainer.load(str(self.ckpt_dir))
            self.start_step = int(self.client_state["step"])
            log.info("resumed from %s at step %d", self.ckpt_dir, self.start_step)
        self.dataset = BuiltDataset(cfg.data.path)
        self.gateway = self.server = self.pool = None
        if self.is_driver:
            self._ray_init()
            self.engine = build_engine(cfg.engine, model_cfg, self.tokenizer)
            self.gateway = Gateway(self.engine, self.tokenizer, cfg.gateway)
            self.server = GatewayServer(self.gateway).start()
            # bank readers (reward actors, lineage checks) embed queries through the gateway under an
            # identity of their own that never declares a chunk, so it can never record a segment
            self.reader_embedder = Endpoint(
                self.server.base_url, self.gateway.register("bank-readers", bank_id="*"), "all-MiniLM-L6-v2"
            )
            self.scheduler = WindowScheduler(
                self.dataset.windows, list(cfg.harnesses), self.run_dir, growth_bounds=growth_bounds
            )
            if "scheduler" in self.client_state:  # the cursor that belongs to the loaded checkpoint
                self.scheduler.restore(self.client_state["scheduler"])
            self.lineage = BankLineage(self.run_dir, self.open_harness)
            if cfg.rollout.mode != "train_only":
                check_ray_capacity(cfg)
                worker_kwargs = dict(
                    harnesses=cfg.harnesses, gateway_url=self.server.url, admin_token=self.gateway.admin_token,
                    model_name=cfg.gateway.served_model_name, tokenizer_path=cfg.model.tokenizer_path,
                    faults=cfg.rollout.faults,
                )  # fmt: skip
                self.pool = RolloutPool(
                    worker_kwargs, cfg.rollout.num_workers, use_ray=cfg.rollout.use_ray,
                    num_cpus_per_worker=cfg.rollout.num_cpus_per_worker,
                )  # fmt: skip
            self.logger = MetricsLogger(cfg.logging, self.run_dir, cfg.run.name)
        # collective (ZeRO-3 gathers every shard): every rank, not only the one that owns the engine;
        # called from rank 0 alone it waits forever for the others (found by a 2-rank torchrun run)
        self.trainer.sync_weights([self.engine] if self.is_driver else [], version=self.start_step)
        torch.manual_seed(cfg.run.seed + self.start_step)

    def _ray_init(self) -> None:
        import ray

        if ray.is_initialized():
            return
        c = self.cfg.cluster
        if c.ray_address == "local":
            ray.init(num_cpus=c.num_cpus, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=c.ray_address, log_to_driver=False)

    def open_harness(self, name: str):
        """A harness for bank housekeeping (promotion checks); no LLM endpoint needed."""
        return BankReaderFactory(self.cfg.harnesses[name], self.run_dir, self.reader_embedder)()

    # ---- rollouts ---------------------------------------------------------------------------------
    def rollout_tasks(
        self, windows: list[ScheduledWindow], num_rollouts: int, step: int
    ) -> list[RolloutTask]:
        tasks = []
        for sw in windows:
            w = sw.window
            parent = self.lineage.parent(w.sequence_id, sw.epoch, w.index)  # verified (silent failure 1)
            chunks = self.dataset.chunks_of(w)
            for i in range(num_rollouts):
                out = self.run_dir / "rollouts" / f"step_{step}" / w.window_id.replace("/", "_") / f"r{i}"
                tasks.append(RolloutTask(w, chunks, i, sw.harness, parent, str(out), step))
        return tasks

    def run_rollouts(self, tasks: list[RolloutTask]) -> list[RolloutResult]:
        assert self.pool is not None, "rollout.mode=train_only has no rollout pool"
        return self.pool.run(tasks)

    def promote(self, sw: ScheduledWindow, result: RolloutResult) -> None:
        w = sw.window
        self.lineage.promote(
            w.sequence_id, sw.epoch, w.index, result.record.final_bank_dir, result.record.trajectory_id, sw.harness,
            size_tokens=result.record.chunks[-1].size_tokens or 0,
        )  # fmt: skip

    def record_bank_sizes(
        self, step: int, windows: list[ScheduledWindow], results: list[RolloutResult], num_rollouts: int
    ) -> None:
        """Append one line per training rollout to `<run>/bank_sizes.jsonl`: the parent bank's and each
        chunk's bank size in tokens, with the chunk statuses and the harness. It is the input of
        `python -m reward.calibrate_growth`, which derives the growth penalty's l_h, u_h and floor per
        harness from OPD rollouts (docs/reward.md; the report does not publish its values). A resumed
        step appends its lines again; the reader keeps the last line per trajectory."""
        lines = []
        for j, sw in enumerate(windows):
            w = sw.window
            parent = self.lineage.parent_size_tokens(w.sequence_id, sw.epoch, w.index) if sw.epoch >= 0 else 0
            for r in results[j * num_rollouts : (j + 1) * num_rollouts]:
                rec = r.record
                lines.append(json.dumps({
                    "step": step, "trajectory_id": rec.trajectory_id, "harness": sw.harness,
                    "sequence_id": w.sequence_id, "window_index": w.index, "status": rec.status,
                    "parent_size_tokens": parent, "size_tokens": [c.size_tokens for c in rec.chunks],
                    "chunk_status": [c.status for c in rec.chunks],
                }) + "\n")  # fmt: skip
        with (self.run_dir / BANK_SIZES_FILE).open("a") as f:
            f.write("".join(lines))

    def clean_rollouts(self, step: int) -> None:
        if not self.cfg.rollout.keep_rollout_dirs:
            shutil.rmtree(self.run_dir / "rollouts" / f"step_{step}", ignore_errors=True)

    # ---- items across ranks, dumps ------------------------------------------------------------------
    def share_items(self, items: list | None) -> list:
        """Rank 0's train items on every rank (torchrun); a no-op on one rank."""
        if self.world_size == 1:
            return items or []
        import torch.distributed as dist

        box = [items]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def dump_items(self, step: int, items: list, extra: dict | None = None) -> None:
        import torch

        d = self.run_dir / "dumps"
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".step_{step}.pt.tmp"
        torch.save({"items": items, **(extra or {})}, tmp)
        tmp.rename(d / f"step_{step}.pt")

    def load_dump(self, step: int) -> dict:
        import torch

        p = self.run_dir / "dumps" / f"step_{step}.pt"
        if not p.exists():
            raise FileNotFoundError(
                f"rollout.mode=train_only: no dump {p} (run with rollout.dump=true first)"
            )
        return torch.load(p, weights_only=False)

    # ---- train / sync / checkpoint --------------------------------------------------------------------
    def train(self, items: list, loss_kind: str) -> dict[str, float]:
        from hymem_train.trainer.packing import plan_step

        per_rank = plan_step(items, self.cfg.trainer.packing, loss_kind, self.world_size)
        return self.trainer.train_step(per_rank[self.rank])

    def sync(self, version: int) -> dict[str, float]:
        receivers = [self.engine] if self.is_driver else []
        return self.trainer.sync_weights(receivers, version)

    def maybe_save(self, step: int, force: bool = False) -> None:
        if not (force or step % self.cfg.save_every == 0):
            return
        # the scheduler cursor travels inside the checkpoint (rank 0 owns it; every rank saves)
        state = self.scheduler.state() if self.is_driver else None
        if self.world_size > 1:
            import torch.distributed as dist

            box = [state]
            dist.broadcast_object_list(box, src=0)
            state = box[0]
        self.trainer.save(str(self.ckpt_dir), {"stage_step": step, "scheduler": state})

    def steps(self, collect, evaluate, loss_kind: str, derive=None) -> dict[str, float]:
        """The loop both stages share, one optimizer step per iteration:

        collect (rank 0: rollouts and their scores -> train items) -> share with every rank -> train ->
        sync weights -> advance the scheduler, held-out eval -> checkpoint -> log. `collect(step)` returns
        (items, metrics, windows done); `evaluate(step)` returns metrics; `derive(metrics)` adds metrics
        computed from the trainer's. Returns the last step's metrics.
        """
        cfg = self.cfg
        last: dict[str, float] = {}
        if self.is_driver and cfg.data.eval_path and self.start_step == 0:
            self.log(0, evaluate(0))
        for step in range(self.start_step + 1, cfg.num_steps + 1):
            items, m, done = None, {}, []
            if self.is_driver and cfg.rollout.mode == "train_only":  # replay a dumped rollout batch
                items = self.load_dump(step)["items"]
            elif self.is_driver:
                items, m, done = collect(step)
                if cfg.rollout.dump:
                    self.dump_items(step, items)
            items = self.share_items(items)
            if cfg.rollout.mode != "rollout_only" and items:
                with self.timer("train"):
                    m.update(self.train(items, loss_kind))
                with self.timer("sync"):
                    m.update(self.sync(step))
                if derive is not None:
                    derive(m)
            if self.is_driver:
                self.scheduler.advance(done)
                self.clean_rollouts(step)
                if cfg.data.eval_path and (step % cfg.save_every == 0 or step == cfg.num_steps):
                    with self.timer("eval"):
                        m.update(evaluate(step))
            self.maybe_save(step, force=step == cfg.num_steps)
            m.update(self.timer.pop())
            self.log(step, m)
            last = m
        self.export_final()
        return last

    def export_final(self) -> Path:
        """Collective: the policy as an HF checkpoint in <run>/final (the next stage's init_checkpoint)."""
        from hymem_train.sft import export_hf

        out = self.run_dir / "final"
        export_hf(self.trainer, self.cfg, out)
        return out

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.is_driver:
            now = self.gateway.metrics()  # gateway counters are cumulative: log this step's share
            prev, self._gw_prev = getattr(self, "_gw_prev", {}), now
            metrics.update(
                {k: v - prev.get(k, 0.0) for k, v in now.items() if k != "gateway/mean_batch_size"}
            )
            metrics["gateway/mean_batch_size"] = now["gateway/mean_batch_size"]
            self.logger.log(step, metrics)

    def close(self, failed: bool = False) -> None:
        """`failed`: this rank is leaving on an exception; its peers may not reach a barrier."""
        if self.pool is not None:
            self.pool.shutdown()
        if self.server is not None:
            self.server.stop()
        if self.is_driver:
            self.logger.finish()
        self.trainer.close(barrier=not failed)


def eval_tasks(rt: Runtime, dataset, num_rollouts: int, step: int, harness: str) -> list[RolloutTask]:
    """Held-out evaluation: the first window of every eval sequence, from an empty bank."""
    tasks = []
    for w in (w for w in dataset.windows if w.index == 0):
        for i in range(num_rollouts):
            out = rt.run_dir / "eval" / f"step_{step}" / w.window_id.replace("/", "_") / f"r{i}"
            tasks.append(RolloutTask(w, dataset.chunks_of(w), i, harness, None, str(out), step))
    return tasks
