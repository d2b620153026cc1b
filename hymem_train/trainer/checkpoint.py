"""Checkpoint and resume: model, optimizer, scheduler (DeepSpeed), per-rank RNG and the data cursor.

A resumed run must continue with identical losses on CPU, so each rank's python / numpy / torch
RNG state is saved next to DeepSpeed's shards. Nothing half-written: each RNG file is written to
a temp name then renamed, before DeepSpeed writes its shards and, last, its `latest` pointer; a
crash mid-save leaves `latest` on the previous complete checkpoint.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(st: dict[str, Any]) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_checkpoint(engine, save_dir: str | Path, step: int, client_state: dict[str, Any]) -> Path:
    """Collective: every rank calls it. `client_state` holds the data cursor and anything the loop needs."""
    save_dir = Path(save_dir)
    tag = f"step_{step}"
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    (save_dir / tag).mkdir(parents=True, exist_ok=True)
    _atomic_save(_rng_state(), save_dir / tag / f"rng_rank{rank}.pt")
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # all RNG files exist before `latest` can point at this tag
    engine.save_checkpoint(str(save_dir), tag=tag, client_state={"step": step, **client_state})
    log.info("saved checkpoint %s", save_dir / tag)
    return save_dir / tag


def load_checkpoint(engine, load_dir: str | Path, tag: str | None = None) -> dict[str, Any]:
    """Restore engine state and this rank's RNG; returns the client state (step, data cursor, ...)."""
    load_dir = Path(load_dir)
    path, client_state = engine.load_checkpoint(str(load_dir), tag=tag)
    if path is None:
        raise FileNotFoundError(f"no DeepSpeed checkpoint under {load_dir} (tag {tag or 'latest'})")
    tag = tag or (load_dir / "latest").read_text().strip()
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    rng_file = load_dir / tag / f"rng_rank{rank}.pt"
    if not rng_file.exists():
        raise FileNotFoundError(
            f"{rng_file}: RNG state of rank {rank} missing (saved with another world size?)"
        )
    _set_rng_state(torch.load(rng_file, weights_only=False))
    log.info("resumed from %s at step %s", load_dir / tag, client_state.get("step"))
    return client_state
