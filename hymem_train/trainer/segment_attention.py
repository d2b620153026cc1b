"""Varlen attention for packed rows without a `[T, T]` mask: causal sdpa per segment.

The dense block-causal mask costs T^2 memory (4 GiB fp32 at the report's 32,768-token row) and sdpa
still computes every masked cross-segment pair. flash-attention's varlen kernel avoids both on GPU;
this is the CPU (and any-device) counterpart: the packed row is split at the segment boundaries
(`cu_seqlens`, passed through the model's attention kwargs) and each piece runs causal sdpa alone,
so cost and memory follow sum(L_i^2) and no segment can see another.

Registered with transformers' AttentionInterface as `hymem_segments`. The mask interface does not
know the name, so transformers builds no mask at all for it. Without `hymem_cu_seqlens` in the
kwargs (e.g. someone runs the training model for generation) it refuses instead of silently
attending across the whole row.

Legend: B batch (1 for packed rows), Hq / Hkv query / key-value heads, T tokens, D head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

NAME = "hymem_segments"
KWARG = "hymem_cu_seqlens"


def segment_sdpa_attention(
    module: torch.nn.Module,
    query_BHTD: torch.Tensor,
    key_BHTD: torch.Tensor,
    value_BHTD: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    cu = kwargs.get(KWARG)
    if cu is None:
        raise ValueError(
            f"attention '{NAME}' needs `{KWARG}` (packed segment boundaries) in the forward kwargs"
        )
    if query_BHTD.shape[0] != 1 or cu[-1] != query_BHTD.shape[2]:
        raise ValueError(
            f"attention '{NAME}': want one packed row of {cu[-1]} tokens, got {tuple(query_BHTD.shape)}"
        )
    gqa = query_BHTD.shape[1] != key_BHTD.shape[1]
    # split, not slicing: the backward of each slice `x[:, :, s:e]` zero-fills a full-row gradient
    # and adds into it (n_segments x T work per tensor, the top cost of a CPU step in
    # docs/performance.md); split's backward is one cat of the per-segment gradients.
    lengths = [int(e) - int(s) for s, e in zip(cu[:-1], cu[1:], strict=True)]
    parts = zip(*(x.split(lengths, dim=2) for x in (query_BHTD, key_BHTD, value_BHTD)), strict=True)
    outs = []
    for q, k, v in parts:
        outs.append(
            F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=gqa
            )
        )
    out_BHTD = torch.cat(outs, dim=2)
    return out_BHTD.transpose(1, 2).contiguous(), None


def use_segment_attention(model: torch.nn.Module) -> None:
    """Switch a training model to per-segment attention (permanently: activation-checkpoint
    recomputation in backward must run the same attention as the forward)."""
    AttentionInterface.register(NAME, segment_sdpa_attention)
    model.config._attn_implementation = NAME
