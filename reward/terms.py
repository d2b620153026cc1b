"""Per-chunk reward terms of one rollout: prm[t], orm[t], pen[t].

Pure functions, numbers in, numbers out. A judge fault is the value `FAULT` (NaN): it is left out
of every denominator (silent failure platform-error-as-reward, governing rule), never read as a 0 for the policy. Each
term comes back as `(value, valid)`; `valid=False` means every item of the cell faulted, so the
cell carries no information about the policy and the advantage code must exclude it.

Legend: C = chunks of the window, F = gold facts of one ORM question.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

FAULT = float("nan")  # a probe / question whose reader or judge call faulted after retries
_E3_MINUS_1 = math.e**3 - 1.0


def is_fault(x: float | None) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def binarize(z: float, threshold: float) -> float:
    """Binary-reward ablation (report: "binary vs rubric reward"): a graded score becomes 0 or 1."""
    if is_fault(z):
        return FAULT
    return 1.0 if z >= threshold else 0.0


def prm(recall_z: Sequence[float], trap_z: Sequence[float], *, use_traps: bool = True) -> tuple[float, bool]:
    """prm[t] = (sum_R z + sum_P z) / (|R| + |P|) over the chunk's non-faulted recall and trap probes.

    A chunk with no probe at all scores 0 (report). A chunk whose probes all faulted is invalid:
    scoring it 0 would turn a judge outage into a policy penalty. `use_traps=False` is the
    "probes only" ablation (traps dropped from numerator and denominator).
    """
    items = list(recall_z) + (list(trap_z) if use_traps else [])
    if not items:
        return 0.0, True
    ok = [float(z) for z in items if not is_fault(z)]
    if not ok:
        return 0.0, False
    return sum(ok) / len(ok), True


def orm_attributed(
    recovered_QF: Sequence[Sequence[bool] | None],
    source_pos_QF: Sequence[Sequence[int | None]],
    num_chunks: int,
    *,
    binary_threshold: float | None = None,
) -> tuple[list[float], list[bool]]:
    """orm[t] = mean over q in Q_t of c_q[t], c_q[t] = share of q's chunk-t gold facts recovered.

    `source_pos_QF[q][f]` is the window position (0..C-1) of the chunk that introduced fact f, or
    None for a fact introduced before this window (it is attributed to no chunk of this window).
    `recovered_QF[q]` is None when q's reader/judge faulted. Q_t empty -> orm[t] = 0, valid; Q_t
    non-empty but all faulted -> invalid. `binary_threshold` set = binary ablation on c_q[t].
    """
    if len(recovered_QF) != len(source_pos_QF):
        raise ValueError(f"orm: {len(recovered_QF)} answers for {len(source_pos_QF)} questions")
    sums_C = [0.0] * num_chunks
    n_ok_C = [0] * num_chunks
    n_all_C = [0] * num_chunks
    for q, (rec_F, src_F) in enumerate(zip(recovered_QF, source_pos_QF, strict=True)):
        if rec_F is not None and len(rec_F) != len(src_F):
            raise ValueError(f"orm: question {q} has {len(src_F)} gold facts but {len(rec_F)} verdicts")
        for t in sorted({p for p in src_F if p is not None}):
            if not 0 <= t < num_chunks:
                raise ValueError(f"orm: question {q} attributes a gold fact to window position {t}")
            n_all_C[t] += 1
            if rec_F is None:
                continue
            mine = [bool(r) for r, p in zip(rec_F, src_F, strict=True) if p == t]
            c = sum(mine) / len(mine)
            if binary_threshold is not None:
                c = binarize(c, binary_threshold)
            sums_C[t] += c
            n_ok_C[t] += 1
    orm_C = [sums_C[t] / n_ok_C[t] if n_ok_C[t] else 0.0 for t in range(num_chunks)]
    valid_C = [n_all_C[t] == 0 or n_ok_C[t] > 0 for t in range(num_chunks)]
    return orm_C, valid_C


def orm_broadcast(
    recovered_QF: Sequence[Sequence[bool] | None],
    num_chunks: int,
    *,
    binary_threshold: float | None = None,
) -> tuple[list[float], list[bool]]:
    """Broadcast-ORM ablation: every chunk gets the window's mean share of gold facts recovered
    (all of a question's facts, wherever they came from), instead of gold-fact attribution."""
    shares = []
    for rec_F in recovered_QF:
        if rec_F is None:
            continue
        if not rec_F:
            raise ValueError("orm_broadcast: a question with no gold facts cannot be scored")
        c = sum(bool(r) for r in rec_F) / len(rec_F)
        shares.append(binarize(c, binary_threshold) if binary_threshold is not None else c)
    if not recovered_QF:
        return [0.0] * num_chunks, [True] * num_chunks
    if not shares:
        return [0.0] * num_chunks, [False] * num_chunks
    v = sum(shares) / len(shares)
    return [v] * num_chunks, [True] * num_chunks


def orm_counterfactual(
    recovered_QF: Sequence[Sequence[bool] | None],
    recovered_CQF: Sequence[Sequence[Sequence[bool] | None]],
    num_chunks: int,
    *,
    binary_threshold: float | None = None,
) -> tuple[list[float], list[bool]]:
    """Counterfactual ORM (reward/counterfactual.py): orm[t] = mean over the window's questions of
    (share of q's gold facts recovered from the final bank) - (the same share with chunk t's writes
    left out). Negative where chunk t's writes cost answers. A question faulted in either reading is
    left out of that chunk's mean; no questions -> 0, valid; all faulted -> invalid."""
    if len(recovered_CQF) != num_chunks:
        raise ValueError(
            f"orm_counterfactual: {len(recovered_CQF)} leave-out readings for {num_chunks} chunks"
        )

    def share(rec_F: Sequence[bool]) -> float:
        if not rec_F:
            raise ValueError("orm_counterfactual: a question with no gold facts cannot be scored")
        c = sum(bool(r) for r in rec_F) / len(rec_F)
        return binarize(c, binary_threshold) if binary_threshold is not None else c

    orm_C, valid_C = [], []
    for t, without_QF in enumerate(recovered_CQF):
        if len(without_QF) != len(recovered_QF):
            raise ValueError(
                f"orm_counterfactual: chunk {t} has {len(without_QF)} answers, want {len(recovered_QF)}"
            )
        d = [
            share(f) - share(w)
            for f, w in zip(recovered_QF, without_QF, strict=True)
            if f is not None and w is not None
        ]
        orm_C.append(sum(d) / len(d) if d else 0.0)
        valid_C.append(bool(d) or not recovered_QF)
    return orm_C, valid_C


def growth_ratio(size_before: int, size_after: int, floor_tokens: int) -> float:
    """g_t = B_t / max(B_{t-1}, floor): the bank's token growth ratio over chunk t.

    The floor is our choice (the report does not say how an empty parent bank is handled): without
    it a first write into an empty bank has an infinite ratio and is always penalised fully.
    """
    if size_before < 0 or size_after < 0:
        raise ValueError(f"growth_ratio: negative bank size ({size_before} -> {size_after})")
    if floor_tokens < 1:
        raise ValueError(f"growth_ratio: floor_tokens must be >= 1, got {floor_tokens}")
    return size_after / max(size_before, floor_tokens)


def growth_penalty(g: float, lower: float, upper: float) -> float:
    """pen = (e^{3x} - 1) / (e^3 - 1), x = clip((g - l_h) / (u_h - l_h), 0, 1) (report, per harness)."""
    if not upper > lower:
        raise ValueError(f"growth_penalty: need upper > lower, got lower={lower} upper={upper}")
    x = min(max((g - lower) / (upper - lower), 0.0), 1.0)
    return (math.exp(3.0 * x) - 1.0) / _E3_MINUS_1
