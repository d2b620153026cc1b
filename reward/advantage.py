"""s[t] and the GRPO advantages of one window's rollout group.

Legend: G = rollouts of the group, C = chunks of the window, S = segments (LLM calls) of a rollout.
`scores_GC[i][t]` is s_i[t]; `valid_GC[i][t]` is False where that cell is a platform fault
(failed rollout, or every judge call of the cell faulted): such cells are left out of the mean
and std and get advantage 0 (silent failure platform-error-as-reward).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

ADVANTAGE_LEVELS = ("chunk", "window")


def chunk_scores(
    prm_C: Sequence[float],
    orm_C: Sequence[float],
    pen_C: Sequence[float],
    *,
    w_prm: float = 1.0,
    w_orm: float = 2.0,
    w_pen: float = 0.3,
    gamma: float = 0.0,
) -> list[float]:
    """s[t] = w_prm * sum_{k>=t} gamma^{k-t} prm[k] + w_orm * orm[t] - w_pen * pen[t]."""
    C = len(prm_C)
    if len(orm_C) != C or len(pen_C) != C:
        raise ValueError(f"chunk_scores: prm/orm/pen lengths differ ({C}, {len(orm_C)}, {len(pen_C)})")
    out = []
    for t in range(C):
        # gamma = 0 must not touch prm[k>t] at all (0 * NaN would be NaN): loop over used terms only
        future = sum(gamma ** (k - t) * prm_C[k] for k in range(t, C) if k == t or gamma != 0.0)
        out.append(w_prm * future + w_orm * orm_C[t] - w_pen * pen_C[t])
    return out


def chunk_score_valid(
    prm_valid_C: Sequence[bool], orm_valid_C: Sequence[bool], pen_valid_C: Sequence[bool], *, gamma: float
) -> list[bool]:
    """s[t] is valid iff every term it reads is: prm[k] for k >= t with gamma^{k-t} != 0, orm[t], pen[t]."""
    C = len(prm_valid_C)
    out = []
    for t in range(C):
        ks = range(t, C) if gamma != 0.0 else range(t, t + 1)
        out.append(all(prm_valid_C[k] for k in ks) and orm_valid_C[t] and pen_valid_C[t])
    return out


def _normalise(values: Sequence[float], eps: float) -> list[float]:
    """(x - mean) / (std + eps) with the unbiased std (n - 1), as verl / TRL GRPO compute it."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return [(v - mean) / (std + eps) for v in values]


def grpo_chunk_advantages(
    scores_GC: Sequence[Sequence[float]], valid_GC: Sequence[Sequence[bool]], *, eps: float = 1e-6
) -> list[list[float]]:
    """A[i,t] = (s_i[t] - mean_t) / (std_t + eps) per chunk column over its valid rollouts.

    One vote per rollout per chunk: the input is one score per (rollout, chunk) cell however many
    LLM calls the chunk made. A column with fewer than 2 valid rollouts gets 0.
    """
    G = len(scores_GC)
    C = len(scores_GC[0]) if G else 0
    adv_GC = [[0.0] * C for _ in range(G)]
    for t in range(C):
        rows = [i for i in range(G) if valid_GC[i][t]]
        if len(rows) < 2:
            continue
        for i, a in zip(rows, _normalise([scores_GC[i][t] for i in rows], eps), strict=True):
            adv_GC[i][t] = a
    return adv_GC


def grpo_window_advantages(
    scores_GC: Sequence[Sequence[float]], valid_GC: Sequence[Sequence[bool]], *, eps: float = 1e-6
) -> list[list[float]]:
    """Window-level (trajectory) ablation: normalise sum_t s_i[t] over rollouts, give every chunk of
    rollout i the same advantage. A rollout with any invalid cell is left out (its sum is unknown)."""
    G = len(scores_GC)
    C = len(scores_GC[0]) if G else 0
    adv_GC = [[0.0] * C for _ in range(G)]
    rows = [i for i in range(G) if all(valid_GC[i])]
    if len(rows) < 2:
        return adv_GC
    for i, a in zip(rows, _normalise([sum(scores_GC[i]) for i in rows], eps), strict=True):
        adv_GC[i] = [a] * C
    return adv_GC


def grpo_advantages(
    scores_GC: Sequence[Sequence[float]],
    valid_GC: Sequence[Sequence[bool]],
    *,
    level: str = "chunk",
    eps: float = 1e-6,
) -> list[list[float]]:
    if level == "chunk":
        return grpo_chunk_advantages(scores_GC, valid_GC, eps=eps)
    if level == "window":
        return grpo_window_advantages(scores_GC, valid_GC, eps=eps)
    raise ValueError(f"advantage level {level!r} not in {ADVANTAGE_LEVELS}")
