"""Weight sync over a process group: trainer rank 0 broadcasts each bucket to every engine replica
process (docs/cluster.md, "Weight sync"). The group is its own (a TCPStore + a gloo or NCCL group made
directly), not the trainer's default world, so replicas never join DeepSpeed's collectives and the
trainer ranks other than 0 are not in it; the same design as OpenRLHF's and verl's weight-update group.

Per bucket: a header (names, shapes, dtypes, version) then one flat tensor per dtype. Replicas that
load vLLM's on-disk names (`weight_names = "serving"`) get the per-expert names of `serving_tensors`,
mapped on the sender, so a replica never sees the fused training names.

Legend: N bytes of a bucket's header (UTF-8 JSON).
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

WEIGHT_NAMES = ("hf", "serving")  # transformers' in-memory names | vLLM's HYV3 on-disk names
_END = "__end_of_sync__"


@dataclass
class WeightGroup:
    """One member of a weight-update group; rank 0 is the sender (trainer rank 0)."""

    pg: Any  # torch.distributed.ProcessGroupGloo / ProcessGroupNCCL
    rank: int
    world_size: int
    device: torch.device
    store: Any  # kept alive: the group's rendezvous

    def broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.pg.broadcast([t], opts).wait()


def open_weight_group(
    host: str, port: int, rank: int, world_size: int, backend: str = "gloo", timeout_s: float = 300.0
) -> WeightGroup:
    """Join the weight-update group at host:port (rank 0 hosts the store). Every member calls this; it
    returns once all `world_size` members have joined, or raises after `timeout_s`."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"weight group backend={backend!r}: want gloo (CPU) or nccl (GPU)")
    if not 0 <= rank < world_size or world_size < 2:
        raise ValueError(f"weight group: rank {rank} of world {world_size} (a sender and >= 1 replica)")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout)
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
        pg = dist.ProcessGroupNCCL(store, rank, world_size)
    else:
        device = torch.device("cpu")
        pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    return WeightGroup(pg, rank, world_size, device, store)


def _send_header(group: WeightGroup, header: dict) -> None:
    raw = torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8)
    group.broadcast(torch.tensor([raw.numel()], dtype=torch.int64, device=group.device))
    group.broadcast(raw.to(group.device))


def _recv_header(group: WeightGroup) -> dict:
    n = torch.zeros(1, dtype=torch.int64, device=group.device)
    group.broadcast(n)
    raw_N = torch.empty(int(n.item()), dtype=torch.uint8, device=group.device)
    group.broadcast(raw_N)
    return json.loads(bytes(raw_N.cpu().numpy()).decode())


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


class WeightBroadcaster:
    """Trainer rank 0's end: a `WeightReceiver` for `sync_weights` that stands for every replica in the
    group. `weight_names` tells `sync_weights` which names the replicas' loaders accept."""

    def __init__(self, group: WeightGroup, weight_names: str = "hf"):
        if group.rank != 0:
            raise ValueError("WeightBroadcaster runs on the group's rank 0 (trainer rank 0)")
        if weight_names not in WEIGHT_NAMES:
            raise ValueError(f"weight_names={weight_names!r} not in {WEIGHT_NAMES}")
        self.group, self.weight_names = group, weight_names
        self.bytes_sent = 0

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        named = list(named_tensors)
        by_dtype: dict[str, list[tuple[str, torch.Tensor]]] = {}
        for n, t in named:
            by_dtype.setdefault(str(t.dtype), []).append((n, t))
        header = {
            "version": version,
            "groups": [[d, [[n, list(t.shape)] for n, t in items]] for d, items in by_dtype.items()],
        }
        _send_header(self.group, header)
        for items in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for _, t in items]).to(self.group.device)
            self.group.broadcast(flat)
            self.bytes_sent += flat.numel() * flat.element_size()
        return len(named)

    def finish_sync(self, version: int) -> None:
        _send_header(self.group, {"version": version, _END: True})


def receive_weights(group: WeightGroup, engine: Any) -> dict[str, float]:
    """A replica's end: receive buckets until the sender's end marker, loading each into `engine`
    (anything with `update_weights(named_tensors, version)`), then the engine's `finish_sync(version)`
    where it has one, as a local sync_weights would. Returns the sync's counters."""
    t0, buckets, nbytes, version = time.perf_counter(), 0, 0, -1
    while True:
        header = _recv_header(group)
        version = header["version"]
        if header.get(_END):
            break
        named: list[tuple[str, torch.Tensor]] = []
        for dname, items in header["groups"]:
            shapes = [torch.Size(s) for _, s in items]
            flat = torch.empty(sum(s.numel() for s in shapes), dtype=_dtype(dname), device=group.device)
            group.broadcast(flat)
            nbytes += flat.numel() * flat.element_size()
            named += [
                (n, t.view(s))
                for (n, _), s, t in zip(items, shapes, flat.split([s.numel() for s in shapes]), strict=True)
            ]
        engine.update_weights(named, version)
        buckets += 1
    if hasattr(engine, "finish_sync"):  # vLLM: finalise the reload, drop the stale prefix cache, serve again
        engine.finish_sync(version)
    return {
        "version": float(version),
        "buckets": float(buckets),
        "bytes": float(nbytes),
        "seconds": time.perf_counter() - t0,
    }
