"""Segment packing: one optimizer step's segments -> equal numbers of packed micro-batches per rank.

Every LLM call a harness makes is an independent segment: in a packed row
each segment restarts its position ids and attends only to itself. Position ids alone do not
isolate segments with sdpa/eager on CPU, so isolation is explicit: `mask="segments"` (default) runs
causal sdpa per segment from the row's `cu_seqlens` (segment_attention.py, no T^2 memory);
`"block_causal"` builds the dense additive mask (any attention implementation, T^2 memory); with
flash-attention on GPU `"position_ids"` lets transformers derive varlen boundaries itself.
Routed experts ride along position by position with their tokens (routing replay, report RL).

Loss weights are fixed here, once for the whole step (all micro-batches, all ranks), so the
update does not depend on how the step is split (report RL objective: token mean per sequence,
then mean over sequences; OPD/SFT: mean over all loss positions).

Legend: T tokens of a packed row, N loss positions, K teacher top-k, L MoE layers, E experts per
token (top-k of the router), R response tokens of a segment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from hymem_train.segments import NOT_ROUTED, Segment
from hymem_train.trainer.config import PackingConfig
from hymem_train.trainer.losses import sequence_mean_weights, token_mean_weight

log = logging.getLogger(__name__)


@dataclass
class TrainItem:
    """One segment plus what the loss needs for it."""

    segment: Segment
    advantage: float = 0.0  # RL: A[i, t] of the segment's chunk (all calls of the chunk share it)
    teacher_topk_ids_RK: np.ndarray | None = None  # OPD: teacher top-k ids per response position
    teacher_topk_logprobs_RK: np.ndarray | None = None  # OPD: their teacher log-probs
    sequence_id: str = ""  # RL aggregation group ("sequence"); empty = the segment itself

    @property
    def key(self) -> str:
        s = self.segment
        return f"{s.trajectory_id}/{s.chunk_index}/{s.call_index}"


@dataclass
class MicroBatch:
    """One packed row (batch dim 1) and its loss positions. Tensors live on CPU until `.to(device)`."""

    input_ids_1T: torch.Tensor
    position_ids_1T: torch.Tensor
    segment_ids_T: torch.Tensor  # segment number within the row; each padding token is its own segment
    loss_pos_N: torch.Tensor  # row positions whose hidden state predicts a response token
    target_ids_N: torch.Tensor
    weight_N: torch.Tensor  # fp64 step-level loss weights (sum over the whole step of w * l is the loss)
    rollout_logp_N: torch.Tensor
    advantage_N: torch.Tensor
    teacher_ids_NK: torch.Tensor | None = None
    teacher_logp_NK: torch.Tensor | None = None
    routes_1TLE: torch.Tensor | None = None  # int16, -1 = free routing (padding, unrouted positions)
    item_keys: list[str] = field(default_factory=list)
    num_real_tokens: int = 0
    cu_seqlens: tuple[int, ...] = ()  # segment boundaries in the row (the padding tail is one more piece)

    def to(self, device: torch.device | str) -> MicroBatch:
        out = {}
        for k, v in self.__dict__.items():
            out[k] = v.to(device) if isinstance(v, torch.Tensor) else v
        return MicroBatch(**out)


def block_causal_mask(segment_ids_T: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive mask [1, 1, T, T]: 0 where query i may see key j (same segment, j <= i), else dtype min.

    Additive (not bool) because transformers' eager attention adds the mask to the scores; sdpa
    accepts the same tensor. Every row sees at least itself, so no softmax row is all -inf.
    """
    T = segment_ids_T.shape[0]
    same_TT = segment_ids_T[:, None] == segment_ids_T[None, :]
    causal_TT = torch.ones(T, T, dtype=torch.bool, device=segment_ids_T.device).tril_()
    mask_TT = torch.zeros(T, T, dtype=dtype, device=segment_ids_T.device)
    mask_TT.masked_fill_(~(same_TT & causal_TT), torch.finfo(dtype).min)
    return mask_TT[None, None]


def _check_item(item: TrainItem, loss_kind: str) -> None:
    s = item.segment
    if len(s.prompt_ids) < 1 or len(s.response_ids) < 1:
        raise ValueError(f"segment {item.key}: needs >= 1 prompt and >= 1 response token to train on")
    if s.chunk_index < 0 and loss_kind == "ppo":
        # silent failure chunk-unmapped: a segment with no chunk would receive a broadcast score
        raise ValueError(
            f"segment {item.key}: chunk_index {s.chunk_index} (no chunk mapping; silent failure chunk-unmapped)"
        )
    if loss_kind == "opd":
        ids, lps = item.teacher_topk_ids_RK, item.teacher_topk_logprobs_RK
        if ids is None or lps is None or np.size(ids) == 0:
            # silent failure teacher-without-topk: never train OPD against a missing teacher distribution
            raise ValueError(
                f"segment {item.key}: teacher returned no top-k (silent failure teacher-without-topk)"
            )
        R = len(s.response_ids)
        if np.shape(ids) != np.shape(lps) or np.ndim(ids) != 2 or np.shape(ids)[0] != R:
            raise ValueError(
                f"segment {item.key}: teacher top-k ids {np.shape(ids)} / logprobs {np.shape(lps)} "
                f"do not cover its {R} response tokens as [R, K]"
            )
        if not np.isfinite(np.asarray(lps, dtype=np.float64)).all():
            raise ValueError(f"segment {item.key}: teacher top-k logprobs hold non-finite values")


def step_weights(items: list[TrainItem], loss_kind: str) -> list[np.ndarray]:
    """Per item, the fp64 weight of each of its response tokens for the whole step."""
    counts = [len(it.segment.response_ids) for it in items]
    if loss_kind in ("opd", "sft"):
        w = token_mean_weight(sum(counts))
        return [np.full(c, w) for c in counts]
    groups: dict[str, int] = {}
    for it, c in zip(items, counts, strict=True):
        gid = it.sequence_id or it.key
        groups[gid] = groups.get(gid, 0) + c
    gids = list(groups)
    w_S = sequence_mean_weights(torch.tensor([groups[g] for g in gids])).numpy()
    w_of = dict(zip(gids, w_S, strict=True))
    return [np.full(c, w_of[it.sequence_id or it.key]) for it, c in zip(items, counts, strict=True)]


def plan_updates(
    items: list[TrainItem], num_ppo_epochs: int = 1, num_mini_batches: int = 1, seed: int = 0
) -> list[list[TrainItem]]:
    """The optimizer updates of one rollout batch, in order: `num_ppo_epochs` passes over the batch,
    each a fresh shuffle split into `num_mini_batches` mini-batches. The split is by whole sequences
    (the loss's sequence unit, `TrainItem.sequence_id`): a sequence's segments share one
    mini-batch, so `plan_step` weighs it as one sequence of that mini-batch. 1 x 1 = `[items]`
    (one optimizer step per batch). Every rank calls this with the same items and seed and gets the
    same plan."""
    if num_ppo_epochs < 1 or num_mini_batches < 1:
        raise ValueError(
            f"plan_updates: num_ppo_epochs={num_ppo_epochs}, num_mini_batches={num_mini_batches}"
        )
    if num_ppo_epochs == 1 and num_mini_batches == 1:
        return [items]
    groups: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault(it.sequence_id or it.key, []).append(i)
    gids = list(groups)
    if len(gids) < num_mini_batches:
        raise ValueError(
            f"plan_updates: {len(gids)} sequences cannot fill trainer.num_mini_batches={num_mini_batches}"
        )
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num_ppo_epochs):
        for part in np.array_split(rng.permutation(len(gids)), num_mini_batches):
            out.append([items[i] for i in sorted(i for g in part for i in groups[gids[g]])])
    return out


def _bins_first_fit_decreasing(lengths: list[int], capacity: int, max_count: int = 0) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, r in enumerate(room):
            if lengths[i] <= r and (max_count <= 0 or len(bins[b]) < max_count):
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


def plan_step(
    items: list[TrainItem], cfg: PackingConfig, loss_kind: str, world_size: int = 1
) -> list[list[MicroBatch]]:
    """Pack a whole step's items into micro-batches; returns one list per rank, all of equal length.

    Every rank calls this with the same items and keeps its own list: ZeRO-3 gathers parameters
    collectively in every forward, so ranks must run the same number of micro-batches; missing
    ones are filled with a one-token padding row that carries no loss.
    """
    if not items:
        raise ValueError("plan_step: no items for this step")
    for it in items:
        _check_item(it, loss_kind)
    lengths = [it.segment.num_tokens for it in items]
    for it, n in zip(items, lengths, strict=True):
        if n > cfg.num_tokens_per_micro_batch:
            raise ValueError(
                f"segment {it.key}: {n} tokens exceed trainer.packing.num_tokens_per_micro_batch="
                f"{cfg.num_tokens_per_micro_batch}"
            )
    weights = step_weights(items, loss_kind)
    bins = _bins_first_fit_decreasing(
        lengths, cfg.num_tokens_per_micro_batch, cfg.max_segments_per_micro_batch
    )
    num_per_rank = -(-len(bins) // world_size)
    bins += [[] for _ in range(num_per_rank * world_size - len(bins))]
    # longest-processing-time assignment: balance tokens per rank, equal micro-batch counts
    load = [0] * world_size
    per_rank: list[list[list[int]]] = [[] for _ in range(world_size)]
    for b in sorted(bins, key=lambda b: -sum(lengths[i] for i in b)):
        r = min((r for r in range(world_size) if len(per_rank[r]) < num_per_rank), key=lambda r: load[r])
        per_rank[r].append(b)
        load[r] += sum(lengths[i] for i in b)
    return [[_build(items, weights, sorted(b), cfg, loss_kind) for b in rank_bins] for rank_bins in per_rank]


def _build(
    items: list[TrainItem], weights: list[np.ndarray], idx: list[int], cfg: PackingConfig, loss_kind: str
) -> MicroBatch:
    ids, pos, seg, loss_pos, tgt, w, old, adv, t_ids, t_lp, routes = ([] for _ in range(11))
    route_shape = None
    for it in (items[i] for i in idx):
        r = it.segment.routed_experts_TLK
        if r is not None:
            if route_shape is not None and r.shape[1:] != route_shape:
                raise ValueError(f"segment {it.key}: routed experts {r.shape[1:]} differ from {route_shape}")
            route_shape = r.shape[1:]
    off = 0
    cu = [0]
    for n_seg, i in enumerate(idx):
        it, s = items[i], items[i].segment
        P, R = len(s.prompt_ids), len(s.response_ids)
        ids.append(np.asarray(s.input_ids, dtype=np.int64))
        pos.append(np.arange(P + R))
        seg.append(np.full(P + R, n_seg))
        loss_pos.append(off + P - 1 + np.arange(R))
        tgt.append(np.asarray(s.response_ids, dtype=np.int64))
        w.append(weights[i])
        old.append(np.asarray(s.logprobs, dtype=np.float32))
        adv.append(np.full(R, it.advantage, dtype=np.float32))
        if loss_kind == "opd":
            t_ids.append(np.asarray(it.teacher_topk_ids_RK, dtype=np.int64))
            t_lp.append(np.asarray(it.teacher_topk_logprobs_RK, dtype=np.float32))
        if route_shape is not None:
            r = s.routed_experts_TLK
            routes.append(r if r is not None else np.full((P + R, *route_shape), NOT_ROUTED, np.int16))
        off += P + R
        cu.append(off)
    T = max(off, 1)
    T = -(-T // cfg.pad_to_multiple) * cfg.pad_to_multiple
    n_pad = T - off
    if n_pad:
        cu.append(T)  # padding attends causally within the tail only; it carries no loss
    ids.append(np.zeros(n_pad, dtype=np.int64))
    pos.append(np.zeros(n_pad, dtype=np.int64))
    seg.append(len(idx) + np.arange(n_pad))  # each pad token alone: attends to itself only
    if route_shape is not None:
        routes.append(np.full((n_pad, *route_shape), NOT_ROUTED, np.int16))

    def cat(xs, dtype, width=None):
        if not xs:
            return torch.zeros((0,) if width is None else (0, width), dtype=dtype)
        return torch.from_numpy(np.concatenate(xs)).to(dtype)

    K = t_ids[0].shape[1] if t_ids else 1
    return MicroBatch(
        input_ids_1T=cat(ids, torch.long)[None],
        position_ids_1T=cat(pos, torch.long)[None],
        segment_ids_T=cat(seg, torch.long),
        loss_pos_N=cat(loss_pos, torch.long),
        target_ids_N=cat(tgt, torch.long),
        weight_N=cat(w, torch.float64),
        rollout_logp_N=cat(old, torch.float32),
        advantage_N=cat(adv, torch.float32),
        teacher_ids_NK=cat(t_ids, torch.long, K) if loss_kind == "opd" else None,
        teacher_logp_NK=cat(t_lp, torch.float32, K) if loss_kind == "opd" else None,
        routes_1TLE=cat(routes, torch.int16)[None] if route_shape is not None else None,
        item_keys=[items[i].key for i in idx],
        num_real_tokens=off,
        cu_seqlens=tuple(cu),
    )


def padding_share(micro_batches: list[MicroBatch], capacity: int | None = None) -> float:
    """Share of computed (or, with `capacity`, of reserved) token slots that hold no real token."""
    real = sum(mb.num_real_tokens for mb in micro_batches)
    total = sum(capacity or mb.input_ids_1T.shape[1] for mb in micro_batches)
    return 1.0 - real / total if total else 0.0
