"""MoE routing capture and replay for HYV3 (the report's "MoE routing replay").

Why: the rollout engine and the trainer compute the router in different kernels/precisions, so the
top-k expert choice can flip between the two for the same token. Replaying the engine's choice in the
training forward keeps the trained policy the one that produced the tokens (importance ratios stay
meaningful). The gate *weights* are recomputed from the live router logits on the forced ids, so the
router still receives gradient.

Mechanism: one forward hook on each sparse layer's `mlp.gate` (HYV3TopKRouter), which returns
`(router_logits, top_k_weights, top_k_index)`. The hook either records `top_k_index` (capture) or
swaps in forced ids and the matching recomputed weights (replay). No fork of the model file.

Keying: routes are addressed by MoE-layer ordinal, not by call order, so an activation-checkpoint
recomputation of a layer replays exactly the same routes (and in replay mode stats are overwritten,
not double counted).

Legend: N = tokens of one forward (batch x seq, flattened as the router sees them), L = MoE layers,
K = experts per token. A row of -1 (`NOT_ROUTED`) means "do not replay, route freely" (e.g. the last
sampled token of a segment, which the engine never forwarded).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

NOT_ROUTED = -1


class RoutingMismatchError(ValueError):
    """Replayed routes that do not fit the forward they are applied to."""


@dataclass
class RouteRecord:
    """Routes captured during `capture()`: one [N, L, K] array per model forward call."""

    num_layers: int
    calls: list[np.ndarray] = field(default_factory=list)

    @property
    def routes_TLK(self) -> np.ndarray:
        """All calls concatenated along tokens (e.g. prefill then each decode step)."""
        if not self.calls:
            return np.zeros((0, self.num_layers, 0), dtype=np.int16)
        return np.concatenate(self.calls, axis=0)


class RoutingController:
    """Capture / replay controller attached to one HYV3 model. Use `RoutingController.attach(model)`."""

    def __init__(self, model: nn.Module, gates: list[nn.Module]):
        if not gates:
            raise ValueError("model has no HYV3 MoE routers (no sparse layers): nothing to capture or replay")
        self.model = model
        self.gates = gates
        self.num_layers = len(gates)
        self.top_k = int(gates[0].top_k)
        self.num_experts = int(gates[0].num_experts)
        self._mode = "off"
        self._pending: list[list[torch.Tensor]] = [[] for _ in gates]
        self._record: RouteRecord | None = None
        self._replay_NLK: torch.Tensor | None = None
        self._mismatch = [(0, 0)] * self.num_layers  # per layer: (slots that differ, slots replayed)
        self._handles = [g.register_forward_hook(self._make_hook(i)) for i, g in enumerate(gates)]

    @classmethod
    def attach(cls, model: nn.Module) -> RoutingController:
        existing = getattr(model, "_hymem_routing", None)
        if existing is not None:
            return existing
        gates = [m for m in model.modules() if type(m).__name__ == "HYV3TopKRouter"]
        ctl = cls(model, gates)
        model._hymem_routing = ctl  # one controller per model: a second attach returns it
        return ctl

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if getattr(self.model, "_hymem_routing", None) is self:
            del self.model._hymem_routing

    # ---- modes ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self) -> Iterator[RouteRecord]:
        """Record the experts each forward chose. For inference (no activation checkpointing)."""
        self._enter("capture")
        rec = RouteRecord(num_layers=self.num_layers)
        self._record = rec
        self._pending = [[] for _ in self.gates]
        try:
            yield rec
        finally:
            self._flush()
            self._record = None
            self._mode = "off"

    @contextlib.contextmanager
    def replay(self, routes: torch.Tensor | np.ndarray) -> Iterator[RoutingController]:
        """Force the given expert ids: routes [N, L, K] or [B, S, L, K] for the next forward(s).

        Positions whose row holds NOT_ROUTED (-1) route freely. The router still gets gradient.
        """
        self._enter("replay")
        r = torch.as_tensor(np.asarray(routes) if not isinstance(routes, torch.Tensor) else routes)
        if r.dim() == 4:
            r = r.reshape(-1, r.shape[-2], r.shape[-1])
        if r.dim() != 3:
            self._mode = "off"
            raise RoutingMismatchError(
                f"routes must be [N, L, K] or [B, S, L, K], got shape {tuple(r.shape)}"
            )
        if r.shape[1] != self.num_layers or r.shape[2] != self.top_k:
            self._mode = "off"
            raise RoutingMismatchError(
                f"routes have {r.shape[1]} layers x top-{r.shape[2]}, model has {self.num_layers} MoE layers "
                f"x top-{self.top_k}"
            )
        bad = (r != NOT_ROUTED) & ((r < 0) | (r >= self.num_experts))
        if bool(bad.any()):
            self._mode = "off"
            raise RoutingMismatchError(f"routes hold expert ids outside [0, {self.num_experts}) (and not -1)")
        self._replay_NLK = r.long()
        self._mismatch = [(0, 0)] * self.num_layers
        try:
            yield self
        finally:
            self._replay_NLK = None
            self._mode = "off"

    def stats(self) -> dict[str, float]:
        """Share of replayed (token, layer) slots where the live router's top-k set differs."""
        diff = sum(int(d) for d, _ in self._mismatch)
        tot = sum(int(t) for _, t in self._mismatch)
        return {"moe/replay_mismatch_rate": (diff / tot) if tot else 0.0, "moe/replayed_slots": float(tot)}

    # ---- internals -----------------------------------------------------------------------------
    def _enter(self, mode: str) -> None:
        if self._mode != "off":
            raise RuntimeError(f"routing controller already in {self._mode!r} mode")
        self._mode = mode

    def _flush(self) -> None:
        """Turn per-layer pending captures into per-call [N, L, K] arrays."""
        if self._record is None:
            return
        counts = {len(p) for p in self._pending}
        if len(counts) != 1:
            raise RuntimeError(f"uneven capture across MoE layers: calls per layer {sorted(counts)}")
        for call in zip(*self._pending, strict=True):
            self._record.calls.append(torch.stack(call, dim=1).to(torch.int16).cpu().numpy())
        self._pending = [[] for _ in self.gates]

    def _make_hook(self, layer: int):
        def hook(module: nn.Module, args: tuple, output: tuple) -> tuple | None:
            if self._mode == "capture":
                self._pending[layer].append(output[2].detach())
                return None
            if self._mode != "replay":
                return None
            router_logits_NE, _, free_idx_NK = output
            forced = self._replay_NLK
            assert forced is not None
            n = router_logits_NE.shape[0]
            if forced.shape[0] != n:
                raise RoutingMismatchError(
                    f"MoE layer {layer}: forward routes {n} tokens but replay routes cover {forced.shape[0]} "
                    "(token alignment: routes must be laid out exactly like the input ids)"
                )
            forced_NK = forced[:, layer, :].to(free_idx_NK.device)
            free_rows_N = (forced_NK == NOT_ROUTED).any(dim=-1)
            idx_NK = torch.where(free_rows_N[:, None], free_idx_NK, forced_NK)
            # Same math as HYV3TopKRouter.forward, on the forced ids: sigmoid scores, renormalise, scale.
            weights_NE = torch.sigmoid(router_logits_NE)
            w_NK = weights_NE.gather(1, idx_NK)
            w_NK = w_NK / (w_NK.sum(dim=-1, keepdim=True) + 1e-20) * module.router_scaling_factor
            replayed = ~free_rows_N
            with torch.no_grad():
                a = torch.sort(free_idx_NK, dim=-1).values
                b = torch.sort(idx_NK, dim=-1).values
                differ = ((a != b).any(dim=-1) & replayed).sum()
            # tensors, not .item(): no host sync per layer on GPU; stats() reads them once
            self._mismatch[layer] = (differ, replayed.sum())
            return router_logits_NE, w_NK, idx_NK

        return hook
