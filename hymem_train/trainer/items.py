"""Segments -> TrainItems for the two stages: the joins where silent failures teacher-without-topk and chunk-unmapped live.

Legend: T scored positions of a segment's full sequence (prompt + response), K teacher top-k,
P prompt tokens, R response tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hymem_train.segments import Segment
from hymem_train.trainer.packing import TrainItem

SEQUENCES = ("segment", "chunk", "trajectory")


def _key(s: Segment) -> str:
    return f"{s.trajectory_id}/{s.chunk_index}/{s.call_index}"


def _sequence_id(s: Segment, sequence: str) -> str:
    """The RL aggregation group of a segment ("" = the segment itself, packing's default)."""
    if sequence == "chunk":
        return f"{s.trajectory_id}/{s.chunk_index}"
    return s.trajectory_id if sequence == "trajectory" else ""


def opd_items(segments: Sequence[Segment], teacher_topk: Sequence) -> list[TrainItem]:
    """Attach the teacher's top-k (one `engines.base.TopKLogprobs` per segment, scored over the
    segment's prompt + response) to the response positions: position P-1+j predicts response token j.

    A missing or short teacher answer raises (silent failure teacher-without-topk: never distil against nothing).
    """
    if len(teacher_topk) != len(segments):
        raise ValueError(
            f"opd_items: {len(teacher_topk)} teacher answers for {len(segments)} segments (silent failure teacher-without-topk)"
        )
    out = []
    for s, tk in zip(segments, teacher_topk, strict=True):
        P, R = len(s.prompt_ids), len(s.response_ids)
        if tk is None or tk.ids_TK is None or tk.ids_TK.numel() == 0:
            raise ValueError(
                f"segment {_key(s)}: teacher returned no top-k (silent failure teacher-without-topk)"
            )
        ids_TK = np.asarray(tk.ids_TK)
        lp_TK = np.asarray(tk.logprobs_TK, dtype=np.float32)
        if ids_TK.shape[0] < P + R - 1 or ids_TK.shape != lp_TK.shape:
            raise ValueError(
                f"segment {_key(s)}: teacher top-k covers {ids_TK.shape[0]} positions, need {P + R - 1} "
                f"(prompt {P} + response {R} - 1) (silent failure teacher-without-topk)"
            )
        out.append(
            TrainItem(
                segment=s,
                teacher_topk_ids_RK=ids_TK[P - 1 : P - 1 + R],
                teacher_topk_logprobs_RK=lp_TK[P - 1 : P - 1 + R],
            )
        )
    return out


def rl_items(
    segments: Sequence[Segment], advantages: Mapping[tuple[str, int], float], sequence: str = "segment"
) -> list[TrainItem]:
    """Give each segment the advantage A[i, t] of its (trajectory, chunk) (report RL: every LLM call
    of chunk t of rollout i shares A[i, t]).

    `sequence` picks the aggregation unit of "mean over tokens within each sequence": "segment"
    (one LLM call; `trainer.loss.sequence_unit: segment`), "chunk" (all calls of chunk t of one
    rollout: one vote per chunk, as A[i, t] has one vote; `sequence_unit: chunk`) or "trajectory"
    (all calls of one rollout). A segment whose (trajectory, chunk) has no advantage raises
    (silent failure chunk-unmapped: never broadcast one score).
    """
    if sequence not in SEQUENCES:
        raise ValueError(f"rl_items: sequence={sequence!r}, want one of {SEQUENCES}")
    out = []
    for s in segments:
        k = (s.trajectory_id, s.chunk_index)
        if s.chunk_index < 0 or k not in advantages:
            raise ValueError(
                f"segment {_key(s)}: no advantage for trajectory/chunk {k} (silent failure chunk-unmapped)"
            )
        out.append(
            TrainItem(
                segment=s,
                advantage=float(advantages[k]),
                sequence_id=_sequence_id(s, sequence),
            )
        )
    return out


def teacher_items(groups: Sequence, teacher, k: int) -> list[TrainItem]:
    """OPD: the teacher's top-k over every segment of every usable rollout of the step's
    `WindowRollouts` (platform failures are excluded: silent failure platform-error-as-reward); `opd_items` raises on a
    missing or short teacher answer (silent failure teacher-without-topk)."""
    segs = [s for g in groups for _, r in g.usable() for s in r.segments]
    if not segs:
        return []
    return opd_items(segs, teacher.topk_logprobs([s.input_ids for s in segs], k))


def advantage_items(groups: Sequence, scored: Sequence, sequence: str = "segment") -> list[TrainItem]:
    """RL: every segment of every usable rollout with its chunk's advantage A[i, t], from each
    window's `WindowRollouts` and its reward `GroupResult` (rows in rollout order). Platform-failed
    rollouts are excluded from training (silent failure platform-error-as-reward); `rl_items` raises for a segment whose
    chunk has no advantage (silent failure chunk-unmapped). `sequence`: the loss's sequence unit (`rl_items`)."""
    adv: dict[tuple[str, int], float] = {}
    segs: list[Segment] = []
    for g, res in zip(groups, scored, strict=True):
        for i, r in g.usable():
            for t, c in enumerate(res.chunk_indices):
                adv[(r.record.trajectory_id, c)] = res.scores.adv_GC[i][t]
            segs += r.segments
    return rl_items(segs, adv, sequence)
