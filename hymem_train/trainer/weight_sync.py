"""Bucketed weight sync from the trainer to the inference engines.

One `update_weights` call per bucket of ~`bucket_mb` MiB, not one per parameter: with 48 layers x
128 experts a per-parameter protocol is thousands of round trips per sync. Under ZeRO-3 each
bucket's parameters are gathered collectively on every rank (all ranks must iterate in lockstep),
copied to CPU, and only rank 0 sends. The seconds per sync are logged (`perf/weight_sync_seconds`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from hymem_train.trainer.names import out_dtype, persistent_buffers, serving_tensors

log = logging.getLogger(__name__)


class WeightReceiver(Protocol):
    """What an inference engine exposes (hymem_train/engines: HF engine, vLLM engine), or a stand-in
    for remote replicas (`weight_group.WeightBroadcaster`). Optional attributes: `weight_names`
    ("hf": transformers' names, the default; "serving": vLLM's on-disk per-expert names) and
    `finish_sync(version)`, called once after the last bucket."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int: ...


def as_served(
    bucket: list[tuple[str, torch.Tensor]], weight_names: str, dtype: torch.dtype | None
) -> list[tuple[str, torch.Tensor]]:
    """A bucket of training tensors under the names (and dtypes) a receiver's loader accepts."""
    if weight_names == "hf":
        return [(n, t if dtype is None or not t.is_floating_point() else t.to(dtype)) for n, t in bucket]
    if weight_names != "serving":
        raise ValueError(f"weight receiver: weight_names={weight_names!r}, want 'hf' or 'serving'")

    # fused experts split per expert; the router stays fp32 as vLLM builds it
    return [(m, v.to(out_dtype(m, v, dtype))) for n, t in bucket for m, v in serving_tensors(n, t)]


@dataclass
class WeightSyncConfig:
    bucket_mb: float = 512.0  # MiB of parameters per update_weights call
    dtype: str = "same"  # "same" as training, or "bfloat16" / "float32" for the engines

    def validate(self) -> None:
        if self.bucket_mb <= 0:
            raise ValueError(f"trainer.weight_sync.bucket_mb={self.bucket_mb}: must be > 0")
        if self.dtype not in ("same", "bfloat16", "float32"):
            raise ValueError(f"trainer.weight_sync.dtype={self.dtype!r}: want same / bfloat16 / float32")


def _is_zero3(p: torch.Tensor) -> bool:
    return hasattr(p, "ds_id")


def _full_numel(p: torch.Tensor) -> int:
    return int(p.ds_numel) if _is_zero3(p) else p.numel()


def _plan_buckets(
    named: list[tuple[str, nn.Parameter]], bucket_bytes: int
) -> list[list[tuple[str, nn.Parameter]]]:
    buckets: list[list[tuple[str, nn.Parameter]]] = [[]]
    size = 0
    for name, p in named:
        nbytes = _full_numel(p) * p.element_size()
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append((name, p))
        size += nbytes
    return [b for b in buckets if b]


def iter_full_param_buckets(
    model: nn.Module, bucket_bytes: int, dtype: torch.dtype | None = None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Full (un-partitioned) parameters as CPU tensors, bucket by bucket, in `named_parameters` order.

    Collective under ZeRO-3: every rank must consume the iterator to the end.
    """
    named = list(model.named_parameters())
    for bucket in _plan_buckets(named, bucket_bytes):
        params = [p for _, p in bucket]
        if any(_is_zero3(p) for p in params):
            import deepspeed

            ctx = deepspeed.zero.GatheredParameters(params, modifier_rank=None)
        else:
            ctx = contextlib.nullcontext()
        with ctx, torch.no_grad():
            out = [(n, p.detach().to("cpu", dtype=dtype or p.dtype, copy=True)) for n, p in bucket]
        yield out


def sync_weights(
    model: nn.Module, receivers: list[WeightReceiver], version: int, cfg: WeightSyncConfig, rank: int = 0
) -> dict[str, float]:
    """Push the current weights to every receiver (rank 0 only); returns perf metrics."""
    t0 = time.perf_counter()
    dtype = None if cfg.dtype == "same" else getattr(torch, cfg.dtype)
    layouts = {getattr(r, "weight_names", "hf") for r in receivers} if rank == 0 else set()
    num_buckets = num_bytes = 0

    def send(bucket: list[tuple[str, torch.Tensor]]) -> None:
        nonlocal num_buckets, num_bytes
        num_buckets += 1
        for names in layouts:  # each layout's names computed once, for every receiver that reads it
            served = as_served(bucket, names, dtype)
            num_bytes += sum(t.numel() * t.element_size() for _, t in served)
            for r in receivers:
                if getattr(r, "weight_names", "hf") == names:
                    r.update_weights(served, version)

    for bucket in iter_full_param_buckets(model, int(cfg.bucket_mb * 2**20)):
        send(bucket)  # collective under ZeRO-3: every rank gathers, rank 0 sends
    if layouts:
        # persistent buffers (the router's score-correction bias, vLLM's expert_bias): not partitioned
        # by ZeRO-3, not trained, but a replica must hold the trainer's, whatever it loaded at start

        if buffers := list(persistent_buffers(model).items()):
            send(buffers)
        for r in receivers:
            if hasattr(r, "finish_sync"):
                r.finish_sync(version)
    seconds = time.perf_counter() - t0
    log.info(
        "weight sync v%d: %d buckets, %.1f MiB, %.2f s", version, num_buckets, num_bytes / 2**20, seconds
    )
    return {
        "perf/weight_sync_seconds": seconds,
        "perf/weight_sync_buckets": float(num_buckets),
        "perf/weight_sync_mib": num_bytes / 2**20,
    }
