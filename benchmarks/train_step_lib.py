"""Shared by bench_train_step.py (DeepSpeed step) and device_check.py (plain torch step).

Imports nothing of DeepSpeed, Ray, Hydra or OmegaConf: the GPU check runs on a machine without them.
Pieces: memory-writer PPO/OPD items (with routes to replay), the model-FLOP count of one step, the
dense-matmul peak of a device and dtype, MoE experts implementations, gradient checkpointing on/off,
and a plain torch AdamW step on the trainer's own `PolicyLoss` forward/backward.

Model FLOPs of one optimizer step (useful work only: padding and activation-checkpoint recomputation
are not counted, the usual MFU convention):

    6 * (A - V*H) * T  +  6 * V*H * N  +  6 * layers * heads * head_dim * sum_i L_i^2

A = active parameters without the input embedding (`count_params(...).active_non_embedding`: routed
top-k + shared experts, router, attention, norms, lm_head), T = real tokens of the step, V*H = the
lm_head, which the chunked loss applies only at the N loss positions, L_i = length of packed segment i
(attention is per segment and causal: QK^T and AV are 2 * 2 * d * L^2 / 2 FLOPs per head forward,
x3 for forward + backward).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from hymem_train.models.routing import RoutingController
from hymem_train.segments import NOT_ROUTED, Segment
from hymem_train.trainer.config import LossConfig
from hymem_train.trainer.packing import MicroBatch, TrainItem

EXPERTS_IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm")  # HYV3's @use_experts_implementation


def memory_writer_lengths(n: int, seed: int, scale: int, capacity: int) -> list[tuple[int, int]]:
    """(prompt, response) lengths of the memory-writer mix (bench_packing.py): prompts lognormal around
    1.5k tokens capped at 28,672, responses around 200 capped at 4,096; divided by `scale`."""
    rng = np.random.default_rng(seed)
    P = np.clip(rng.lognormal(np.log(1500), 0.8, n), 64, 28_672) // scale
    R = np.clip(rng.lognormal(np.log(200), 0.9, n), 8, 4_096) // scale
    out = []
    for p, r in zip(P, R, strict=True):
        p, r = max(int(p), 2), max(int(r), 1)
        p = min(p, capacity - r)  # a segment must fit one packed row
        out.append((p, r))
    return out


def make_step_items(
    config, num_tokens: int, capacity: int, kind: str = "ppo", scale: int = 16, seed: int = 0, topk: int = 50
) -> list[TrainItem]:
    """Memory-writer segments totalling about `num_tokens` real tokens. PPO items carry rollout
    logprobs, an advantage and routes to replay (random distinct top-k experts per token and layer:
    the cost of replay does not depend on which experts; the last sampled token is NOT_ROUTED, as
    the engine never forwards it). OPD items carry the teacher's top-`topk` ids and logprobs."""
    rng = np.random.default_rng(seed)
    V, L = config.vocab_size, config.num_hidden_layers
    E, K = config.num_experts, config.num_experts_per_tok
    items, total, i = [], 0, 0
    lengths = memory_writer_lengths(4 * max(num_tokens // 64, 16), seed, scale, capacity)
    while total < num_tokens:
        P, R = lengths[i % len(lengths)]
        rem = num_tokens - total
        if rem < P + R:  # the last segment fills the budget exactly
            R = min(R, max(rem // 4, 1))
            P = max(rem - R, 1)
        T = P + R
        routes = None
        if kind == "ppo":
            routes = np.argpartition(rng.random((T, L, E), dtype=np.float32), K - 1, axis=-1)[..., :K]
            routes = routes.astype(np.int16)
            routes[-1] = NOT_ROUTED
        seg = Segment(
            trajectory_id=f"t{i // 4}",
            chunk_index=i % 4,
            call_index=0,
            prompt_ids=rng.integers(1, V, P).tolist(),
            response_ids=rng.integers(1, V, R).tolist(),
            logprobs=(-rng.random(R) * 3).tolist(),
            finish_reason="stop",
            routed_experts_TLK=routes,
        )
        it = TrainItem(segment=seg, advantage=float(rng.normal()), sequence_id=f"t{i // 4}")
        if kind == "opd":
            k = min(topk, V)
            logits = rng.normal(size=(R, k + 1)) * 2
            lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            it.teacher_topk_ids_RK = np.stack([rng.choice(V, k, replace=False) for _ in range(R)])
            it.teacher_topk_logprobs_RK = np.sort(lp[:, :k], -1)[:, ::-1].copy()
        items.append(it)
        total += T
        i += 1
    return items


@dataclass
class StepFlops:
    real_tokens: int
    row_tokens: int
    loss_positions: int
    segments: int
    dense: float  # 6 * (A - V*H) * T
    head: float  # 6 * V*H * N
    attention: float  # 6 * layers * heads * head_dim * sum L_i^2

    @property
    def total(self) -> float:
        return self.dense + self.head + self.attention


def step_flops(config, micro_batches: list[MicroBatch]) -> StepFlops:
    from hymem_train.models.presets import count_params

    c = count_params(config)
    head = config.vocab_size * config.hidden_size
    body = c.active_non_embedding - (0 if config.tie_word_embeddings else head)
    T = sum(mb.num_real_tokens for mb in micro_batches)
    N = sum(int(mb.loss_pos_N.numel()) for mb in micro_batches)
    sq = nseg = 0
    for mb in micro_batches:
        cu = mb.cu_seqlens[: len(mb.item_keys) + 1]  # real segments only (the padding tail is last)
        sq += sum((e - s) ** 2 for s, e in zip(cu[:-1], cu[1:], strict=True))
        nseg += len(mb.item_keys)
    attn = 6.0 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * sq
    return StepFlops(
        real_tokens=T,
        row_tokens=sum(int(mb.input_ids_1T.shape[1]) for mb in micro_batches),
        loss_positions=N,
        segments=nseg,
        dense=6.0 * body * T,
        head=6.0 * head * N,
        attention=attn,
    )


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device, dtype: torch.dtype, n: int, iters: int = 5, repeats: int = 3) -> float:
    """Dense [n, n] @ [n, n] FLOP/s, best of `repeats` timings of `iters` products (after one warm-up):
    the peak this device reaches in this dtype right now. Compute bound for n >= 1024 (intensity n/3
    FLOPs per byte in fp32 on a cold cache; the operands of n=1024 fp32 even fit L2/L3)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    c = a @ b
    sync(device)
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            c = torch.mm(a, b, out=c)
        sync(device)
        best = max(best, 2.0 * n**3 * iters / (time.perf_counter() - t))
    return best


def experts_modules(model) -> list:
    return [m for m in model.modules() if type(m).__name__ == "HYV3Experts"]


def set_experts(model, impl: str) -> str | None:
    """Switch every HYV3Experts to `impl`; None if it ran a probe forward+backward here, else why not."""
    try:
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation(impl)
        else:  # an older transformers: the experts forward reads the config at call time
            model.config._experts_implementation = impl
        if model.config._experts_implementation != impl:
            return f"transformers picked {model.config._experts_implementation!r} instead"
        ex = experts_modules(model)[0]
        p = next(model.parameters())
        h = torch.randn(4, model.config.hidden_size, device=p.device, dtype=p.dtype, requires_grad=True)
        k = model.config.num_experts_per_tok
        idx = torch.arange(k, device=p.device).repeat(4, 1)
        w = torch.full((4, k), 1.0 / k, device=p.device, dtype=p.dtype)
        ex(h, idx, w).sum().backward()
        model.zero_grad(set_to_none=True)
        return None
    except Exception as e:  # noqa: BLE001 - any failure means "not usable here"; say which
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


def available_experts_implementations() -> list[str]:
    """The three HYV3 options first, then any other registered one (e.g. deepgemm, sonicmoe)."""
    names = list(EXPERTS_IMPLEMENTATIONS)
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        names += sorted(k for k in ALL_EXPERTS_FUNCTIONS.keys() if k not in names)  # noqa: SIM118
    except ImportError:
        pass
    return names


def batched_mm_skip_reason(config, row_tokens: int, dtype: torch.dtype, limit_bytes: float) -> str | None:
    """batched_mm gathers each (token, expert) pair's full expert weights (gate_up + down) before its
    bmm: row_tokens * top_k * 3 * H * I elements. Say so instead of running out of memory."""
    n = row_tokens * config.num_experts_per_tok * 3 * config.hidden_size * config.moe_intermediate_size
    need = n * torch.empty(0, dtype=dtype).element_size()
    if need > limit_bytes:
        return f"skipped: would gather {need / 2**30:,.0f} GiB of expert weights per layer (limit {limit_bytes / 2**30:,.0f} GiB)"
    return None


def set_gradient_checkpointing(model, on: bool) -> None:
    """Non-reentrant activation checkpointing on/off on a live model (the engine's setting).
    transformers >= 5.2x names it activation_checkpointing_*; older 5.x gradient_checkpointing_*."""
    kw = {"use_reentrant": False}
    if on:
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    elif hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


class PlainStep:
    """One optimizer step without DeepSpeed: the trainer's `PolicyLoss` forward/backward per micro-batch
    (routing replay around both, as engine.py does), grad-norm clip, torch AdamW. For machines
    without DeepSpeed (the GPU check); parameters stay in the model's dtype (bf16 there)."""

    def __init__(self, model, loss_kind: str = "ppo", lr: float = 5e-6, max_grad_norm: float = 1.0):
        from hymem_train.trainer.policy import PolicyLoss

        model.config.use_cache = False
        self.model = model
        self.policy = PolicyLoss(model, LossConfig(kind=loss_kind), "segments")
        self.routing = RoutingController.attach(model)
        self.max_grad_norm = max_grad_norm
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8)
        self.device = next(model.parameters()).device

    def __call__(self, micro_batches: list[MicroBatch]) -> float:
        self.policy.train()
        total = 0.0
        for mb in micro_batches:
            dev = mb.to(self.device)
            ctx = (
                self.routing.replay(dev.routes_1TLE)
                if dev.routes_1TLE is not None
                else contextlib.nullcontext()
            )
            with ctx:
                loss, _ = self.policy(dev)
                loss.backward()
            total += float(loss.detach())
        if self.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total


@dataclass
class ConfigResult:
    experts: str
    grad_ckpt: bool
    seconds: list[float]
    peak_memory_bytes: int | None = None
    error: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")


def measure_configs(
    model,
    step_fn,
    micro_batches: list[MicroBatch],
    experts: list[str],
    grad_ckpt: list[bool],
    warmup: int,
    steps: int,
    device,
    log=print,
    skip: dict[str, str] | None = None,
) -> list[ConfigResult]:
    """Time `step_fn(micro_batches)` for every (experts, checkpointing) pair on the same live model,
    round-robin (warm-up rounds first, not timed) so machine noise hits every config alike."""
    results: list[ConfigResult] = []
    runnable = []
    for impl in experts:
        why = (skip or {}).get(impl) or set_experts(model, impl)
        for gc in grad_ckpt:
            results.append(ConfigResult(impl, gc, [], error=why))
            if why is None:
                runnable.append(results[-1])
    for r in range(warmup + steps):
        for res in runnable:
            if res.error is not None:
                continue
            set_experts(model, res.experts)
            set_gradient_checkpointing(model, res.grad_ckpt)
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            sync(device)
            t = time.perf_counter()
            try:
                step_fn(micro_batches)
                sync(device)
            except torch.OutOfMemoryError as e:
                res.error = f"OutOfMemoryError: {str(e).splitlines()[0][:100]}"
                continue
            dt = time.perf_counter() - t
            if torch.device(device).type == "cuda":
                res.peak_memory_bytes = max(res.peak_memory_bytes or 0, torch.cuda.max_memory_allocated())
            if r >= warmup:
                res.seconds.append(dt)
            log(
                f"  round {r}{' (warm-up)' if r < warmup else ''}: {res.experts}, ckpt {'on' if res.grad_ckpt else 'off'}: {dt:.3f} s"
            )
    return results
