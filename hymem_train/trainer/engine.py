"""DeepSpeed ZeRO-3 trainer around the HF HYV3 model: one `train_step(micro_batches)` per optimizer step.

- MoE blocks are ZeRO-3 leaf modules: the experts a token visits differ per forward, which breaks
  ZeRO-3's recorded prefetch order and hangs multi-rank runs otherwise.
- Gradient accumulation is unmanaged (`managed_gradient_accumulation: false`, `backward(...,
  scale_wrt_gas=False)`): packing yields a variable number of micro-batches per step, and the
  loss weights already carry the step's denominators (packing.py), so DeepSpeed's 1/GA scaling
  must not be applied; its 1/world-size gradient averaging is undone by `PolicyLoss.loss_scale`.
- Constant learning rate (report: 1e-6 OPD, 5e-6 RL) through a LambdaLR so it is checkpointed.
- Routing replay wraps forward *and* backward: with gradient checkpointing the layer forward is
  recomputed during backward, and a recomputation outside the replay context would route freely.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import socket
import time
from collections.abc import Callable

import torch
from torch import nn

from hymem_train.models.loading import load_model
from hymem_train.models.routing import RoutingController
from hymem_train.trainer.checkpoint import load_checkpoint, save_checkpoint
from hymem_train.trainer.config import TrainerConfig
from hymem_train.trainer.packing import MicroBatch, plan_step, plan_updates
from hymem_train.trainer.policy import PolicyLoss
from hymem_train.trainer.weight_sync import WeightSyncConfig, sync_weights

log = logging.getLogger(__name__)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def init_distributed() -> tuple[int, int]:
    """Start torch.distributed through DeepSpeed (gloo on CPU, NCCL on GPU); returns (rank, world)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    if not torch.cuda.is_available():
        # DeepSpeed's CPU comm JIT-compiles a shared-memory all-reduce (deepspeed_shm_comm: ~50 s on 2
        # cores on a new box, again whenever another venv's torch built it last) that only its
        # inference_all_reduce calls, never training; marked unbuildable, it is skipped (None)
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

    if "RANK" not in os.environ:  # single process without torchrun
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        # a port the OS says is free, not a fixed or pid-derived one that another job may hold
        os.environ.setdefault("MASTER_PORT", str(_free_port(os.environ["MASTER_ADDR"])))
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def seed_everything(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _moe_block_class(model: nn.Module) -> type | None:
    for m in model.modules():
        if type(m).__name__ == "HYV3MoE":
            return type(m)
    return None


def use_bf16(cfg: TrainerConfig) -> bool:
    return cfg.precision == "bf16" or (cfg.precision == "auto" and torch.cuda.is_available())


def deepspeed_config(cfg: TrainerConfig) -> dict:
    """The DeepSpeed config of the trainer; also the one `deepspeed.zero.Init` partitions the model by."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": {
            "stage": cfg.zero_stage,
            "overlap_comm": False,
            "contiguous_gradients": True,
            "stage3_param_persistence_threshold": cfg.zero_persistence_threshold,
        },
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": use_bf16(cfg)},
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }


def load_trainer_model(model_cfg, cfg: TrainerConfig) -> nn.Module:
    """The trainer's copy of the model (`models/loading.py load_model`).

    ZeRO-3 with `trainer.zero_init` (the default) and a checkpoint path: the model is built inside
    `deepspeed.zero.Init`, so each rank holds only its 1/world partition from construction on. An HF
    directory goes through transformers' ZeRO-3 loader (rank 0 memory-maps the safetensors shards and
    scatters one module at a time; the other ranks read shapes only); a DeepSpeed step checkpoint is
    copied one consolidated parameter at a time (`load_step_checkpoint`). A preset (no path) is built
    whole: presets are the generated test models. Needs torch.distributed, so it starts it."""
    if cfg.zero_stage != 3 or not cfg.zero_init or not model_cfg.path:
        return load_model(model_cfg)
    init_distributed()
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    # transformers keeps only a weak reference: `hf_ds` must live through the load. Unset right after,
    # so the engines' own loads in this process stay whole.
    hf_ds = HfDeepSpeedConfig(deepspeed_config(cfg))
    try:
        model = load_model(model_cfg)
    finally:
        unset_hf_deepspeed_config()
        del hf_ds
    return model


class Trainer:
    """Owns the DeepSpeed engine; the entry points call `train_step`, `save`, `load`, `sync_weights`."""

    def __init__(self, cfg: TrainerConfig, model: nn.Module, lr_factor: Callable[[int], float] | None = None):
        """`lr_factor(k)` scales `cfg.lr` for optimizer step k (0-based, counted over resumes); None keeps
        it constant (the stages' schedule)."""
        cfg.validate()
        self.cfg = cfg
        self.rank, self.world_size = init_distributed()
        import deepspeed
        from deepspeed.utils import set_z3_leaf_modules

        seed_everything(cfg.seed)
        if cfg.zero_stage == 3 and (moe := _moe_block_class(model)) is not None:
            set_z3_leaf_modules(model, [moe])
        if cfg.gradient_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        self.policy = PolicyLoss(model, cfg.loss, cfg.packing.mask)
        self.policy.loss_scale = float(self.world_size)
        if cfg.zero_stage == 3:
            deepspeed.zero.register_external_parameter(self.policy, model.lm_head.weight)
        # torch AdamW as the client optimizer: DeepSpeedCPUAdam needs a C++ op build that is not
        # available on every CPU box; ZeRO-3 hands AdamW its fp32 partitions either way.
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=cfg.lr,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor or (lambda _step: 1.0))
        ds_config = deepspeed_config(cfg)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=self.policy, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )
        self.model = model
        self.routing = None
        if cfg.routing_replay and _moe_block_class(model) is not None:
            self.routing = RoutingController.attach(model)
        self.device = self.engine.device
        self.step = 0
        self.last_update_metrics: list[dict[str, float]] = []  # train_items: each optimizer update's

    # ---- one optimizer step ----------------------------------------------------------------------
    def _replay(self, mb: MicroBatch):
        if self.routing is None or mb.routes_1TLE is None:
            return contextlib.nullcontext()
        return self.routing.replay(mb.routes_1TLE)

    def recompute_old_logprobs(self, micro_batches: list[MicroBatch]) -> None:
        """PPO `ratio_source: recompute`: old-policy log-probs from the weights before this update."""
        self.engine.eval()
        with torch.no_grad():
            for mb in micro_batches:
                dev = mb.to(self.device)
                with self._replay(dev):
                    mb.rollout_logp_N = self.engine(dev, logprobs_only=True).float().cpu()
        self.engine.train()

    def train_step(
        self, micro_batches: list[MicroBatch], *, old_logprobs_ready: bool = False
    ) -> dict[str, float]:
        """Forward/backward every micro-batch of this rank, one optimizer step; metrics reduced over ranks.

        `old_logprobs_ready`: the items already carry the pre-update policy's log-probs (several PPO
        updates per batch with `ratio_source: recompute`, see `train_items`)."""
        t0 = time.perf_counter()
        if (
            self.cfg.loss.kind == "ppo"
            and self.cfg.loss.ratio_source == "recompute"
            and not old_logprobs_ready
        ):
            self.recompute_old_logprobs(micro_batches)
        self.engine.train()
        sums: dict[str, torch.Tensor] = {}
        mismatch = torch.zeros(2, dtype=torch.float64)
        for mb in micro_batches:
            dev = mb.to(self.device)
            with self._replay(dev):
                loss, stats = self.engine(dev)
                self.engine.backward(loss, scale_wrt_gas=False)
                if self.routing is not None and dev.routes_1TLE is not None:
                    st = self.routing.stats()
                    mismatch += torch.tensor(
                        [st["moe/replay_mismatch_rate"] * st["moe/replayed_slots"], st["moe/replayed_slots"]],
                        dtype=torch.float64,
                    )
            for k, v in stats.items():
                sums[k] = sums.get(k, 0) + v.detach().double().cpu()
        # without ZeRO DeepSpeed clips the fp32 grads but records no global norm (get_global_grad_norm
        # is None): measure it here, before the step reduces and clips them, so stage 0 logs the same metric
        pre_norm = self._plain_grad_norm() if self.cfg.zero_stage == 0 else None
        lr = float(self.scheduler.get_last_lr()[0])  # the rate this step uses; engine.step moves it on
        self.engine.step()
        grad_norm = pre_norm if pre_norm is not None else self.engine.get_global_grad_norm()
        self.step += 1
        keys = sorted(sums)
        vec = torch.stack([sums[k] for k in keys] + [mismatch[0], mismatch[1]])
        if self.world_size > 1:
            torch.distributed.all_reduce(vec)  # every metric is a sum: reduce by addition
        tot = dict(zip(keys + ["_mm_diff", "_mm_tot"], vec.tolist(), strict=True))
        return self._metrics(tot, grad_norm, lr, time.perf_counter() - t0)

    def train_items(self, items: list, loss_kind: str) -> dict[str, float]:
        """Collective: one rollout batch -> its optimizer updates. Each update packs its items over
        every rank (each gets the same number of micro-batches) and trains on this rank's share.

        PPO with `num_ppo_epochs` x `num_mini_batches` > 1: `plan_updates` splits the batch by whole
        sequences and reshuffles per epoch; the ratio is taken against the rollout engine's
        log-probs (`ratio_source: rollout`) or against the policy before the batch's first update
        (`recompute`, computed once here). Metrics: the mean over updates (`perf/step_seconds`: the
        sum), `train/num_updates`; each update's own in `self.last_update_metrics`."""
        cfg = self.cfg
        n_updates = cfg.num_ppo_epochs * cfg.num_mini_batches if loss_kind == "ppo" else 1
        if n_updates == 1:
            per_rank = plan_step(items, cfg.packing, loss_kind, self.world_size)
            self.last_update_metrics = [self.train_step(per_rank[self.rank])]
            return self.last_update_metrics[0]
        ready = cfg.loss.ratio_source == "recompute"
        if ready:
            items = self._with_old_logprobs(items, loss_kind)
        updates = plan_updates(items, cfg.num_ppo_epochs, cfg.num_mini_batches, seed=cfg.seed + self.step)
        ms = []
        for u in updates:
            per_rank = plan_step(u, cfg.packing, loss_kind, self.world_size)
            ms.append(self.train_step(per_rank[self.rank], old_logprobs_ready=ready))
        self.last_update_metrics = ms
        out = {k: sum(m[k] for m in ms if k in m) / sum(k in m for m in ms) for k in ms[-1]}
        out["perf/step_seconds"] = sum(m["perf/step_seconds"] for m in ms)
        out["train/num_updates"] = float(len(ms))
        return out

    def _with_old_logprobs(self, items: list, loss_kind: str) -> list:
        """Collective: copies of `items` whose segments carry the current (pre-update) policy's
        log-probs of their response tokens, computed once for the whole batch."""
        mbs = plan_step(items, self.cfg.packing, loss_kind, self.world_size)[self.rank]
        self.recompute_old_logprobs(mbs)
        by_key: dict[str, list[float]] = {}
        lengths = {it.key: len(it.segment.response_ids) for it in items}
        for mb in mbs:
            off = 0
            for key in mb.item_keys:
                by_key[key] = mb.rollout_logp_N[off : off + lengths[key]].tolist()
                off += lengths[key]
        if self.world_size > 1:
            parts: list = [None] * self.world_size
            torch.distributed.all_gather_object(parts, by_key)
            by_key = {k: v for p in parts for k, v in p.items()}
        return [
            dataclasses.replace(it, segment=dataclasses.replace(it.segment, logprobs=by_key[it.key]))
            for it in items
        ]

    def broadcast(self, obj):
        """Collective: rank 0's picklable `obj` on every rank (a no-op on one rank)."""
        if self.world_size == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def _plain_grad_norm(self) -> float:
        params = list(self.model.parameters())
        if all(p.grad is None for p in params):
            return 0.0
        if self.world_size == 1:
            return float(torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))
        # stage 0 reduces the gradients inside engine.step (managed_gradient_accumulation is off), so each
        # rank holds only its own share here: the norm that DeepSpeed clips is the norm of their mean
        # (each share is already scaled by the world size, see PolicyLoss.loss_scale). A parameter without
        # a gradient on this rank (an expert no token of its share chose) counts as zeros. The cost, one
        # more all-reduce of the gradients per step, is paid only here: multi-rank runs default to stage 3.
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
        )
        torch.distributed.all_reduce(flat)
        return float(flat.div_(self.world_size).norm())

    # ---- checkpoint / weight sync -------------------------------------------------------------------
    def save(self, save_dir: str, client_state: dict | None = None) -> str:
        """Collective. `client_state` carries the data cursor; the trainer step is added here."""
        return str(save_checkpoint(self.engine, save_dir, self.step, dict(client_state or {})))

    def load(self, load_dir: str, tag: str | None = None) -> dict:
        """Collective. Restores model, optimizer, scheduler, RNG; returns the saved client state."""
        state = load_checkpoint(self.engine, load_dir, tag)
        self.step = int(state["step"])
        return state

    def close(self, barrier: bool = True) -> None:
        """Collective (unless `barrier=False`, for a rank that is failing alone). Tears the
        process group down before the interpreter exits.

        Left to interpreter shutdown, gloo's transport threads can be destroyed while still
        joinable, and a rank then dies with 'terminate called without an active exception'
        (SIGABRT) after its work is done, failing the whole torchrun job (seen in CI, 2 ranks).
        """
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if barrier:
                torch.distributed.barrier()
            torch.distributed.destroy_process_group()

    def sync_weights(self, receivers: list, version: int, cfg=None) -> dict[str, float]:
        """Collective. Pushes the HF model's weights to `receivers` from rank 0 in buckets."""
        return sync_weights(self.model, receivers, version, cfg or WeightSyncConfig(), self.rank)

    def _metrics(self, tot: dict[str, float], grad_norm, lr: float, seconds: float) -> dict[str, float]:
        n = max(tot.get("train/num_loss_tokens", 0.0), 1.0)
        m = {
            "train/loss": tot["train/loss_weighted_sum"],
            "train/num_loss_tokens": tot["train/num_loss_tokens"],
            "train/grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
            "train/lr": lr,
            "perf/step_seconds": seconds,
            "perf/tokens_per_s": tot["perf/num_real_tokens"] / max(seconds, 1e-9),
            "perf/padding_share": 1.0 - tot["perf/num_real_tokens"] / max(tot["perf/num_row_tokens"], 1.0),
        }
        if self.cfg.loss.kind == "opd":
            c = max(tot["distill/count"], 1.0)
            m["distill/student_mass_on_support"] = tot["distill/student_mass_sum"] / c
            m["distill/teacher_mass_on_support"] = tot["distill/teacher_mass_sum"] / c
            m["distill/teacher_token_coverage"] = tot["distill/coverage_sum"] / c
            m["distill/entropy"] = tot["distill/entropy_sum"] / c
        else:
            if self.cfg.loss.kind == "ppo":
                m["train/clipfrac"] = tot["train/clipped_sum"] / n
                m["train/clipfrac_low"] = tot["train/clipped_low_sum"] / n  # A < 0, r < 1 - clip_low
                m["train/clipfrac_high"] = tot["train/clipped_high_sum"] / n  # A > 0, r > 1 + clip_high
                m["train/ratio_mean"] = tot["train/ratio_sum"] / n
            if self.cfg.loss.log_entropy:
                m["train/entropy"] = tot["train/entropy_sum"] / n
        if tot["_mm_tot"] > 0:
            m["moe/replay_mismatch_rate"] = tot["_mm_diff"] / tot["_mm_tot"]
        return m
