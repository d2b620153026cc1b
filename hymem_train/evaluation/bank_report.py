"""Bank metrics of the swap matrix (reward/bank_metrics.py): on ledger-world data in the native harness,
each writer's final bank per sequence is opened read-only (the harness's read_all through its adapter)
and measured against the sequence's gold memory points, without the reader. Output:
<run>/eval/bank_metrics.json (per writer and sequence the counts; per writer the pooled metrics with
paired-bootstrap 95% intervals over sequences; paired differences for each pair of consecutive writers
in config order and each writer vs the first) and <run>/eval/bank_metrics.md (the tables)."""

from __future__ import annotations

import json
import logging
import math
import uuid
from pathlib import Path
from typing import Any

from data_pipeline.store import atomic_write_text
from harnesses.base import write_json_atomic
from harnesses.registry import make_harness
from hymem_train.evaluation.matrix import HarnessPlan, MatrixRun, Unit, ledger_sequences, release_harness
from reward.bank_metrics import (
    METRICS,
    RATE_METRICS,
    BootstrapResult,
    Interval,
    paired_bootstrap,
    sequence_counts,
)

log = logging.getLogger(__name__)

# the markdown's tables: (title, metrics)
TABLES = (
    (
        "Extraction",
        [
            "memory_recall",
            "target_precision",
            "false_memory_resistance",
            "restated_once",
            "unparsed_share",
            "bank_records",
            "bank_tokens",
        ],
    ),
    (
        "Updates (keys that changed)",
        ["update_correct", "update_hallucination", "update_omission", "update_history_lost", "history_kept"],
    ),
    (
        "Operation mix (the bank build's applied ops)",
        ["op_add", "op_update", "op_delete", "op_none", "op_invalid"],
    ),
)


def comparison_pairs(writers: list[str]) -> list[tuple[str, str]]:
    """(later, earlier): each pair of consecutive writers in config order, then each writer vs the first."""
    pairs = [(writers[i + 1], writers[i]) for i in range(len(writers) - 1)]
    return pairs + [(w, writers[0]) for w in writers[2:]]


def bank_texts(unit: Unit, hcfg) -> list[str]:
    """The record texts of a unit's finished bank (opened read-side, never written)."""
    h = make_harness(hcfg, None, None, sandbox_root=unit.dir, sandbox_id=f"metrics-{uuid.uuid4().hex[:8]}")
    try:
        h.open(unit.dir / "bank")
        return [e.text for e in h.read_all()]
    finally:
        release_harness(h)


def harness_bank_metrics(matrix: MatrixRun, p: HarnessPlan, *, resamples: int, seed: int) -> dict[str, Any]:
    """Counts per writer and sequence for one harness, then the bootstrap. A sequence whose bank build
    failed for any writer is left out for every writer (the bootstrap is paired) and listed."""
    hcfg = matrix.cfg.harnesses[p.harness]
    chunks_of: dict[str, list[Any]] = {}
    for c in p.dataset.tables["chunks"]:
        chunks_of.setdefault(c.sequence_id, []).append(c)
    writers = [w.name for w in matrix.cfg.writers]
    counts: dict[str, dict[str, Any]] = {}
    failed: dict[str, list[str]] = {}
    for w in matrix.cfg.writers:
        counts[w.name] = {}
        for u in matrix.units(w, p):
            done = u.dir / "build.json"
            build = json.loads(done.read_text()) if done.exists() else {"status": "missing"}
            if build["status"] != "ok":
                failed.setdefault(w.name, []).append(u.sequence_id)
                continue
            texts = bank_texts(u, hcfg)
            counts[w.name][u.sequence_id] = sequence_counts(
                texts, chunks_of[u.sequence_id], ops=build.get("ops")
            )
    dropped = sorted({s for v in failed.values() for s in v})
    for w in writers:
        for s in dropped:
            counts[w].pop(s, None)
    boot = paired_bootstrap(counts, pairs=comparison_pairs(writers), resamples=resamples, seed=seed)
    return {
        "sequences": boot.sequences,
        "excluded_sequences": {w: sorted(v) for w, v in failed.items()},
        "writers": {w: {m: _iv(i) for m, i in boot.pooled[w].items()} for w in writers},
        "differences": [
            {"a": a, "b": b, "metric": m, **_iv(i)}
            for (a, b), ms in boot.diffs.items()
            for m, i in ms.items()
        ],
        "per_sequence": {
            w: {s: {m: list(c) for m, c in cs.items()} for s, cs in counts[w].items()} for w in writers
        },
        "_boot": boot,
    }


def _iv(i: Interval) -> dict[str, float | None]:
    return {k: (None if math.isnan(v) else v) for k, v in (("value", i.value), ("lo", i.lo), ("hi", i.hi))}


def write_bank_metrics(matrix: MatrixRun, plans: list[HarnessPlan]) -> Path | None:
    """bank_metrics.json and .md under the matrix's output for every native harness whose planned
    sequences are all ledger-world ones; the markdown's path, or None when no harness qualifies."""
    cfg = matrix.cfg
    picked = [p for p in plans if cfg.harnesses[p.harness].framework == "native" and ledger_sequences(p)]
    if not picked:
        return None
    res = {
        p.harness: harness_bank_metrics(matrix, p, resamples=cfg.bootstrap_resamples, seed=cfg.seed)
        for p in picked
    }
    md = to_markdown([w.name for w in cfg.writers], {h: r.pop("_boot") for h, r in res.items()}, res)
    doc = {
        "definitions": {m: {"name": n, "definition": d} for m, (n, d) in METRICS.items()},
        "pairs": "a - b: each pair of consecutive writers in config order (later - earlier), each writer - the first",
        "bootstrap": {
            "resamples": cfg.bootstrap_resamples,
            "seed": cfg.seed,
            "unit": "sequence",
            "interval": "2.5th-97.5th percentile",
        },
        "harnesses": res,
    }
    write_json_atomic(matrix.out / "bank_metrics.json", doc)

    atomic_write_text(matrix.out / "bank_metrics.md", md)
    return matrix.out / "bank_metrics.md"


def _fmt(i: Interval | None, signed: bool = False) -> str:
    if i is None or math.isnan(i.value):
        return "-"
    f = "{:+.2f}" if signed else "{:.2f}"
    s = f.format(i.value)
    if not math.isnan(i.lo):
        s += f" [{f.format(i.lo)}, {f.format(i.hi)}]"
    if signed and not math.isnan(i.lo) and i.lo <= 0 <= i.hi:
        s += " tie"
    return s


def to_markdown(writers: list[str], boots: dict[str, BootstrapResult], res: dict[str, Any]) -> str:
    L = ["# Bank metrics (read from the banks, not through the reader)", ""]
    L += [
        "HaluMem's extraction and updating metrics (arXiv:2511.03506) against the ledger world's gold memory "
        "points, by parsing the records (reward/bank_metrics.py). Pooled over sequences (sum of numerators / "
        "sum of denominators); [paired-bootstrap 95% interval], sequences resampled, the same draw for every "
        f"writer. Shares in [0, 1]; {', '.join(METRICS[m][0] for m in METRICS if m not in RATE_METRICS)}: "
        "per sequence.",
        "",
    ]
    for h, boot in boots.items():
        L += [f"## {h}: {len(boot.sequences)} sequences", ""]
        for w, seqs in res[h]["excluded_sequences"].items():
            L.append(f"- left out for every writer: {len(seqs)} sequence(s) whose bank build failed for {w}")
        for title, ms in TABLES:
            ms = [m for m in ms if any(m in boot.pooled[w] for w in writers)]
            if not ms:
                continue
            L += [
                f"### {title}",
                "",
                "| Writer | " + " | ".join(METRICS[m][0] for m in ms) + " |",
                "|---" * (len(ms) + 1) + "|",
            ]
            L += [f"| {w} | " + " | ".join(_fmt(boot.pooled[w].get(m)) for m in ms) + " |" for w in writers]
            L.append("")
        for title, ms in TABLES if boot.diffs else ():
            ms = [m for m in ms if any(m in d for d in boot.diffs.values())]
            if not ms:
                continue
            L += [
                f"### Paired differences, {title[0].lower() + title[1:]} (a - b; an interval containing 0 is a tie)",
                "",
            ]
            L += ["| a - b | " + " | ".join(METRICS[m][0] for m in ms) + " |", "|---" * (len(ms) + 1) + "|"]
            L += [
                f"| {a} - {b} | " + " | ".join(_fmt(d.get(m), signed=True) for m in ms) + " |"
                for (a, b), d in boot.diffs.items()
            ]
            L.append("")
    L += ["## Definitions", ""] + [f"- **{n}**: {d}" for n, d in METRICS.values()]
    return "\n".join(L) + "\n"
