"""Data builders shared by the trainer tests and tests/trainer/dist_worker.py."""

from __future__ import annotations

import numpy as np

from hymem_train.segments import Segment
from hymem_train.trainer.packing import TrainItem


def make_segment(
    rng: np.random.Generator, P: int, R: int, vocab: int, traj: str = "t0", chunk: int = 0, call: int = 0
):
    return Segment(
        trajectory_id=traj,
        chunk_index=chunk,
        call_index=call,
        prompt_ids=rng.integers(1, vocab, P).tolist(),
        response_ids=rng.integers(1, vocab, R).tolist(),
        logprobs=(-rng.random(R) * 3).tolist(),
        finish_reason="stop",
    )


def make_items(
    n: int,
    vocab: int,
    seed: int = 0,
    kind: str = "ppo",
    K: int = 4,
    lengths: list[tuple[int, int]] | None = None,
) -> list[TrainItem]:
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        P, R = lengths[i] if lengths else (int(rng.integers(3, 12)), int(rng.integers(2, 8)))
        seg = make_segment(rng, P, R, vocab, traj=f"t{i // 2}", chunk=i % 2, call=0)
        it = TrainItem(segment=seg, advantage=float(rng.normal()), sequence_id=f"t{i // 2}")
        if kind == "opd":
            logits = rng.normal(size=(R, vocab)) * 2
            lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            ids = np.argsort(-lp, axis=-1)[:, :K]
            it.teacher_topk_ids_RK = ids
            it.teacher_topk_logprobs_RK = np.take_along_axis(lp, ids, -1)
        items.append(it)
    return items
