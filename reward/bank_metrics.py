"""Bank metrics read from the bank itself (not through a reader): HaluMem's memory-extraction and
memory-updating metrics (arXiv:2511.03506) for a ledger-world bank (data_pipeline/ledger.py) against
its gold memory points, computed by parsing the records instead of with an LLM judge.

Per sequence, `sequence_counts(records, chunks)` gives each metric as (numerator, denominator) counts,
so sequences pool (sum of numerators over sum of denominators) and resample; `paired_bootstrap` gives
pooled values with 95% percentile intervals, and paired differences between writers, resampling
sequences (the same resampled set for every writer in a replicate). Pure functions, deterministic.

A record is matched to a key when it parses in the ledger's record grammar (`parse_record`) and its
normalised key is that key; values compare case-insensitively; dates are not compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from data_pipeline.ledger import (
    LedgerRecord,
    gold_records,
    normalise_key,
    parse_record,
    statements,
)

Counts = dict[str, tuple[float, float]]  # metric -> (numerator, denominator) of one sequence

# metric -> (display name, definition); the order is the tables' column order
METRICS: dict[str, tuple[str, str]] = {
    "memory_recall": (
        "Memory recall",
        "gold keys with a record whose current value is the gold current value / gold keys",
    ),
    "target_precision": (
        "Target precision",
        "records that are a gold point (parse, gold key, current value right; "
        "one per key, a duplicate is not) / records",
    ),
    "false_memory_resistance": (
        "False-memory resistance",
        "transient lines whose key has no record / transient lines",
    ),
    "restated_once": ("Restated once", "restated keys with exactly one record / restated keys"),
    "update_correct": (
        "Update correct",
        "changed keys with one record holding every gold state in order / changed keys",
    ),
    "update_hallucination": (
        "Update hallucination",
        "changed keys with a record whose current value was never stated for the key / changed keys",
    ),
    "update_omission": (
        "Update omission",
        "changed keys with no record, two or more records, the old state still "
        "current, or only a prefix of the states / changed keys",
    ),
    "update_history_lost": (
        "Update history lost",
        "changed keys with one record, current value right, earlier states not the gold ones / changed keys",
    ),
    "history_kept": (
        "History kept",
        "changed keys with a record holding every gold state in order / changed keys",
    ),
    "unparsed_share": ("Unparsed records", "records outside the record grammar (prose) / records"),
    "bank_records": ("Records", "records per sequence"),
    "bank_tokens": ("Tokens", "tokens per sequence (whitespace words unless a tokenizer is given)"),
    "op_add": ("ADD", "ADD ops applied / ops"),
    "op_update": ("UPDATE", "UPDATE ops applied / ops"),
    "op_delete": ("DELETE", "DELETE ops applied / ops"),
    "op_none": ("NONE", "chunk writes that changed nothing (a NONE reply) / ops"),
    "op_invalid": ("INVALID", "chunk writes whose reply had no valid op (policy error) / ops"),
}
RATE_METRICS = [m for m in METRICS if m not in ("bank_records", "bank_tokens")]  # shares in [0, 1]
OP_KEYS = {
    "ADD": "op_add",
    "UPDATE": "op_update",
    "DELETE": "op_delete",
    "NONE": "op_none",
    "INVALID": "op_invalid",
}


def _v(s: str) -> str:
    return s.casefold()


def _values(r: LedgerRecord) -> list[str]:
    return [_v(x) for x in r.values]


def _is_prefix(short: list[str], long: list[str]) -> bool:
    return len(short) < len(long) and long[: len(short)] == short


@dataclass
class LedgerTruth:
    """What one sequence's chunks say the bank should hold (keys normalised)."""

    gold: dict[str, LedgerRecord]  # key -> its gold record (every state)
    stated: dict[str, set[str]]  # key -> every value stated for it (new, restated, changed), casefolded
    restated: set[str]  # keys restated at least once
    transient: list[str] = field(default_factory=list)  # key of each transient (small-talk) line


def ledger_truth(chunks: Iterable[Any]) -> LedgerTruth:
    chunks = sorted(chunks, key=lambda c: c.index)
    gold = {}
    for text in gold_records(chunks):
        r = parse_record(text)
        if r is None:  # gold records are in the grammar by construction
            raise ValueError(f"gold record does not parse: {text!r}")
        gold[normalise_key(r.key)] = r
    stated: dict[str, set[str]] = {}
    restated: set[str] = set()
    transient: list[str] = []
    for c in chunks:
        for s in statements(c):
            key = normalise_key(s.attr)
            if s.kind == "transient":
                transient.append(key)
                continue
            stated.setdefault(key, set()).add(_v(s.value))
            if s.kind == "restate":
                restated.add(key)
    return LedgerTruth(gold, stated, restated, transient)


def update_outcome(recs: list[LedgerRecord], gold: LedgerRecord, stated: set[str]) -> str:
    """One changed key's outcome: correct | hallucination | omission | history_lost (exclusive, in this
    order of precedence after hallucination)."""
    want = _values(gold)
    if any(_v(r.current) not in stated for r in recs):
        return "hallucination"
    if len(recs) != 1:  # missing, or the old record sits beside the new one
        return "omission"
    got = _values(recs[0])
    if got == want:
        return "correct"
    if got[-1] != want[-1] or _is_prefix(got, want):  # the old state is still current / the change is missing
        return "omission"
    return "history_lost"


def sequence_counts(
    records: list[str],
    chunks: Iterable[Any],
    *,
    count_tokens: Callable[[str], int] | None = None,
    ops: dict[str, int] | None = None,
) -> Counts:
    """Every metric of METRICS as (numerator, denominator) for one sequence's final bank `records`
    (texts, as the harness's read_all gives them) against its ledger `chunks`; `ops`: the bank build's
    op counts (`op_counts`), without which the op-mix metrics are left out."""
    truth = ledger_truth(chunks)
    count_tokens = count_tokens or (lambda t: len(t.split()))
    by_key: dict[str, list[LedgerRecord]] = {}
    unparsed = 0
    hits: set[str] = set()  # gold keys with a target record (each counted once)
    for text in records:
        r = parse_record(text)
        if r is None:
            unparsed += 1
            continue
        k = normalise_key(r.key)
        by_key.setdefault(k, []).append(r)
        g = truth.gold.get(k)
        if g is not None and _v(r.current) == _v(g.current):
            hits.add(k)
    n = len(records)
    changed = [k for k, g in truth.gold.items() if len(g.states) > 1]
    outcomes = [update_outcome(by_key.get(k, []), truth.gold[k], truth.stated.get(k, set())) for k in changed]
    kept = sum(any(_values(r) == _values(truth.gold[k]) for r in by_key.get(k, [])) for k in changed)
    out: Counts = {
        "memory_recall": (len(hits), len(truth.gold)),
        "target_precision": (len(hits), n),
        "false_memory_resistance": (sum(k not in by_key for k in truth.transient), len(truth.transient)),
        "restated_once": (sum(len(by_key.get(k, [])) == 1 for k in truth.restated), len(truth.restated)),
        **{
            f"update_{o}": (outcomes.count(o), len(changed))
            for o in ("correct", "hallucination", "omission", "history_lost")
        },
        "history_kept": (kept, len(changed)),
        "unparsed_share": (unparsed, n),
        "bank_records": (n, 1),
        "bank_tokens": (sum(count_tokens(t) for t in records), 1),
    }
    if ops is not None:
        total = sum(ops.get(k, 0) for k in OP_KEYS)
        out.update({m: (ops.get(k, 0), total) for k, m in OP_KEYS.items()})
    return out


def op_counts(writes: list[dict[str, Any]]) -> dict[str, int]:
    """The operation mix of a bank build from its chunk writes (WriteResult.to_json() dicts): ops applied
    by kind, a NONE for each ok write that changed nothing (the native harness accepts such a reply only
    when it says NONE), an INVALID for each policy-error write. Failed (platform) writes are not counted."""
    out = dict.fromkeys(OP_KEYS, 0)
    for w in writes:
        if w["status"] == "ok":
            out["ADD"] += w.get("num_added", 0)
            out["UPDATE"] += w.get("num_updated", 0)
            out["DELETE"] += w.get("num_deleted", 0)
            out["NONE"] += not (w.get("num_added", 0) or w.get("num_updated", 0) or w.get("num_deleted", 0))
        elif w["status"] == "policy_error":
            out["INVALID"] += 1
    return out


# ------------------------------------------------------------------------------------------ bootstrap
@dataclass(frozen=True)
class Interval:
    value: float  # pooled over the sequences (nan when every denominator is 0)
    lo: float  # 2.5th percentile of the resamples
    hi: float  # 97.5th percentile


@dataclass
class BootstrapResult:
    sequences: list[str]  # the resampled units, in order
    pooled: dict[str, dict[str, Interval]]  # writer -> metric -> pooled value with its interval
    diffs: dict[tuple[str, str], dict[str, Interval]]  # (a, b) -> metric -> a - b with its interval


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def _interval(value: float, boot: np.ndarray) -> Interval:
    s = boot[~np.isnan(boot)]
    if s.size == 0 or math.isnan(value):
        return Interval(value, math.nan, math.nan)
    return Interval(value, float(np.percentile(s, 2.5)), float(np.percentile(s, 97.5)))


def paired_bootstrap(
    per_writer: dict[str, dict[str, Counts]],
    *,
    pairs: list[tuple[str, str]] = (),
    resamples: int = 1000,
    seed: int = 0,
    paired: bool = True,
) -> BootstrapResult:
    """`per_writer`: writer -> sequence id -> Counts (every writer the same sequences). Each replicate
    draws sequences with replacement, the same draw for every writer (`paired=False`: an independent
    draw per writer, the unpaired comparison), and pools each metric as sum(num) / sum(den). A metric
    is reported for a writer only when all its sequences carry it."""
    writers = list(per_writer)
    seqs = sorted(per_writer[writers[0]]) if writers else []
    for w in writers:
        if sorted(per_writer[w]) != seqs:
            raise ValueError(f"paired_bootstrap: writer {w} has other sequences than {writers[0]}")
    rng = np.random.default_rng(seed)
    B, n = max(1, resamples), len(seqs)
    shared = rng.integers(0, n, size=(B, n)) if n else np.zeros((B, 0), int)
    boots: dict[str, dict[str, np.ndarray]] = {}
    pooled: dict[str, dict[str, Interval]] = {}
    for w in writers:
        idx = shared if paired else (rng.integers(0, n, size=(B, n)) if n else shared)
        metrics = [m for m in METRICS if n and all(m in per_writer[w][s] for s in seqs)]
        boots[w], pooled[w] = {}, {}
        for m in metrics:
            num = np.array([per_writer[w][s][m][0] for s in seqs], float)
            den = np.array([per_writer[w][s][m][1] for s in seqs], float)
            value = float(_ratio(np.array(num.sum()), np.array(den.sum())))
            boots[w][m] = _ratio(num[idx].sum(axis=1), den[idx].sum(axis=1))
            pooled[w][m] = _interval(value, boots[w][m])
    diffs: dict[tuple[str, str], dict[str, Interval]] = {}
    for a, b in pairs:
        common = [m for m in boots[a] if m in boots[b]]
        diffs[(a, b)] = {
            m: _interval(pooled[a][m].value - pooled[b][m].value, boots[a][m] - boots[b][m]) for m in common
        }
    return BootstrapResult(seqs, pooled, diffs)
