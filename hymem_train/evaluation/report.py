"""The matrix's tables: the report's layout (rows = writers, columns = harnesses + average; a per-metric
table per harness), bootstrap 95% intervals on every cell and on the differences between writers, and a
per-category breakdown. Scores are x100, as in the report.

Failures (docs/evaluation.md, "Failures"), silent failure platform-error-as-reward:
- a **writer failure** (the writer's own: its bank build ended on its timeout or its session's error)
  scores 0 for that writer on every item it touches;
- a **platform failure** (harness, sandbox, network, or the fixed reader / judge after their retries) is
  excluded from the cell for **every** writer, so the writers' pairs stay complete.
Both are counted per cell, with the reader answers cut at their budget (finish_reason "length").

A harness's score is the equal-weight mean of the metrics that ran, except Shopping PS, which the report
shows as its own column and leaves out of every mean; the Average is over harnesses.

Intervals: an item-clustered paired bootstrap. Each replicate draws the source sequences (a LoCoMo
conversation, a LongMemEval haystack) once, for every harness, metric and writer; cells, harness means,
the Average and the writers' differences are all computed from that one draw.
"""

from __future__ import annotations

import csv
import io
import json
import math
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harnesses.base import write_json_atomic

# the report's six metrics, in its column order
REPORT_METRICS = ["LoCoMo Judge", "LongMemEval", "PersonaMem-v2", "Travel SPS", "Shopping PS", "CMB"]
# shown as a column, kept out of every mean: the report does not average Shopping PS (a purchase-level
# pass rate on another scale; docs/evaluation_benchmarks.md)
OUT_OF_MEANS = {"Shopping PS"}
# why a metric cannot run here at all (others that did not run had no data in this run)
NOT_RUN_REASONS = {
    "CMB": "not run (no public data): no public CMB data or scorer was found (docs/evaluation.md)"
}
PLATFORM, WRITER = "platform", "writer"
# "clustered": one draw of source sequences per replicate for everything (the table's intervals);
# "cell": each (harness, metric) cell's items drawn on their own, writers paired inside it (the
# independent bootstrap this table replaced: the comparison section); "unpaired": every writer's cell
# drawn on its own (what a paired test must beat)
RESAMPLING = ("clustered", "cell", "unpaired")
RESAMPLING_UNIT = {"clustered": "sequence", "cell": "item", "unpaired": "sequence"}
TRUNCATION_FLAG = 0.01  # a cell whose cut reader answers exceed this share is flagged


@dataclass
class Cell:
    mean: float  # x100; nan when no item is left
    lo: float
    hi: float
    n: int  # items in the mean (a writer failure is one of them, scored 0)
    writer_failures: int = 0  # this writer's failures (scored 0)
    excluded: int = 0  # items dropped for every writer: a platform failure on them
    truncated: int = 0  # reader answers cut at the budget (in the mean as scored)

    def fmt(self) -> str:
        if self.n == 0:
            return f"excluded ({self.excluded})" if self.excluded else "-"
        s = f"{self.mean:.2f} [{self.lo:.2f}, {self.hi:.2f}]"
        notes = []
        if self.writer_failures:
            notes.append(f"{self.writer_failures} writer-failed")
        if self.excluded:
            notes.append(f"{self.excluded} excluded")
        if self.truncated:
            flag = " TRUNCATION" if self.truncated > TRUNCATION_FLAG * self.n else ""
            notes.append(f"{self.truncated} cut{flag}")
        return s + (f" ({', '.join(notes)})" if notes else "")


@dataclass
class MatrixTable:
    writers: list[str]
    harnesses: list[str]  # display order
    held_out: dict[str, bool]
    metrics: dict[str, list[str]]  # harness -> metric columns that ran
    cells: dict[tuple[str, str, str], Cell]  # (writer, harness, metric)
    harness_scores: dict[tuple[str, str], Cell]  # (writer, harness)
    average: dict[str, Cell]  # writer
    diffs: dict[tuple[str, str, str], Cell]  # (writer a, writer b, harness or "Average"): a - b
    categories: dict[tuple[str, str, str, str], tuple[float, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    resampling: str = "clustered"
    # the same intervals under another resampling ("cell"), for the table's comparison section
    compare: dict[str, Any] = field(default_factory=dict)

    def mean_metrics(self, h: str) -> list[str]:
        return [m for m in self.metrics.get(h, []) if base_metric(m) not in OUT_OF_MEANS]


def base_metric(m: str) -> str:
    return m.split(" (")[0]


def failure_class(rec: dict[str, Any]) -> str | None:
    """None for a scored item; records cached before failures had classes were all platform failures."""
    f = rec.get("failure")
    return None if f is None else f.get("class", PLATFORM)


def _ci(samples: np.ndarray) -> tuple[float, float]:
    s = samples[~np.isnan(samples)]
    if s.size == 0:
        return math.nan, math.nan
    return float(np.percentile(s, 2.5)), float(np.percentile(s, 97.5))


@dataclass
class _CellData:
    mean: float  # x100
    sums: np.ndarray  # [C] per source sequence: sum of scores of the kept items
    counts: np.ndarray  # [C] kept items
    clusters: np.ndarray  # indices of the sequences this cell has items of
    writer_failures: int
    excluded: int
    truncated: int


def build_table(
    records: list[dict[str, Any]],
    writers: list[str],
    harnesses: list[str],
    held_out: dict[str, bool],
    *,
    resamples: int = 1000,
    seed: int = 0,
    resampling: str = "clustered",
    compare: str | None = "cell",
) -> MatrixTable:
    """Cells, harness scores, averages and paired writer differences with bootstrap intervals drawn as
    `resampling` says; `compare` adds the harness and Average intervals under another resampling."""
    if resampling not in RESAMPLING or compare not in (None, *RESAMPLING):
        raise ValueError(f"resampling={resampling!r}, compare={compare!r}: want one of {RESAMPLING}")
    by: dict[tuple[str, str], dict[str, dict[str, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        by[(r["harness"], r["metric"])][r["writer"]][r["item_id"]] = r
    metrics: dict[str, list[str]] = defaultdict(list)
    for h, m in sorted(by, key=lambda k: (harnesses.index(k[0]), _metric_order(k[1]))):
        metrics[h].append(m)
    kept: dict[tuple[str, str], tuple[list[str], int]] = {}  # (harness, metric) -> kept items, excluded
    categories: dict[tuple[str, str, str, str], tuple[float, int]] = {}
    for (h, m), per_writer in by.items():
        items = sorted({i for recs in per_writer.values() for i in recs})
        # a platform failure (or a missing answer) of any writer drops the item for all: pairs stay whole
        excluded = {
            i
            for i in items
            for w in writers
            if i not in per_writer.get(w, {}) or failure_class(per_writer[w][i]) == PLATFORM
        }
        kept[(h, m)] = ([i for i in items if i not in excluded], len(excluded))
        for w in writers:
            cat: dict[str, list[float]] = defaultdict(list)
            for i in kept[(h, m)][0]:
                r = per_writer[w][i]
                cat[r.get("category", "")].append(r.get("score", 0.0))  # writer failure: 0
            for k, v in cat.items():
                categories[(w, h, m, k)] = (float(np.mean(v) * 100), len(v))
    t = MatrixTable(
        writers, harnesses, held_out, dict(metrics), {}, {}, {}, {}, categories, resampling=resampling
    )
    B = max(resamples, 1)
    data, C = _cell_data(by, kept, writers, RESAMPLING_UNIT[resampling])
    _fill(t, data, _replicates(data, C, B, np.random.default_rng(seed), resampling))
    if compare and compare != resampling:
        other = MatrixTable(writers, harnesses, held_out, dict(metrics), {}, {}, {}, {})
        odata, oC = _cell_data(by, kept, writers, RESAMPLING_UNIT[compare])
        _fill(other, odata, _replicates(odata, oC, B, np.random.default_rng(seed), compare))
        t.compare = {
            "resampling": compare,
            "average": other.average,
            "harness_scores": other.harness_scores,
            "diffs": other.diffs,
        }
    return t


def _cell_data(
    by: dict, kept: dict[tuple[str, str], tuple[list[str], int]], writers: list[str], unit: str
) -> tuple[dict[tuple[str, str, str], _CellData], int]:
    """Per cell and writer: its mean, counts, and per-unit score sums over the resampling units (a
    source sequence, or each item on its own). Returns them with the number of units."""
    key = (lambda h, m, r: cluster_of(r)) if unit == "sequence" else (lambda h, m, r: (h, m, r["item_id"]))
    units = sorted(
        {key(h, m, by[(h, m)][w][i]) for (h, m), (items, _) in kept.items() for w in writers for i in items},
        key=str,
    )
    uix = {u: j for j, u in enumerate(units)}
    data = {}
    for (h, m), (items, excluded) in kept.items():
        for w in writers:
            recs = [by[(h, m)][w][i] for i in items]
            s = np.array([r.get("score", 0.0) for r in recs], dtype=float)  # writer failure: 0
            c = np.array([uix[key(h, m, r)] for r in recs], dtype=int)
            data[(w, h, m)] = _CellData(
                float(s.mean() * 100) if recs else math.nan,
                np.bincount(c, weights=s, minlength=len(units)),
                np.bincount(c, minlength=len(units)),
                np.unique(c),
                sum(failure_class(r) == WRITER for r in recs),
                excluded,
                sum(r.get("finish_reason") == "length" for r in recs),
            )
    return data, len(units)


def cluster_of(rec: dict[str, Any]) -> str:
    """The resampling unit: the item's source sequence (every question asked of one conversation)."""
    return rec.get("sequence_id") or rec["item_id"]


def _weights(rng: np.random.Generator, B: int, C: int, among: np.ndarray) -> np.ndarray:
    """[B, C] how often each sequence is drawn, drawing len(among) of them with replacement."""
    idx = among[rng.integers(0, len(among), size=(B, len(among)))] if len(among) else np.zeros((B, 0), int)
    w = np.zeros((B, C))
    np.add.at(w, (np.repeat(np.arange(B), idx.shape[1]), idx.ravel()), 1.0)
    return w


def _stratified_weights(
    rng: np.random.Generator, B: int, C: int, data: dict[tuple[str, str, str], _CellData]
) -> np.ndarray:
    """[B, C] one draw of source sequences shared by every cell, stratified by the metrics a sequence
    feeds: each stratum keeps its size in every replicate. Drawn from the pool as a whole, a replicate
    can miss a benchmark with few sequences (2 LoCoMo conversations among 10 sequences: 11% of draws),
    and the harness mean of that replicate is then the other metrics' mean, another quantity."""
    feeds: dict[int, set[str]] = defaultdict(set)
    for (_, _, m), d in data.items():
        for u in d.clusters:
            feeds[int(u)].add(m)
    strata: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for u in range(C):
        strata[tuple(sorted(feeds[u]))].append(u)
    return sum((_weights(rng, B, C, np.array(strata[k])) for k in sorted(strata)), start=np.zeros((B, C)))


def _replicates(
    data: dict[tuple[str, str, str], _CellData], C: int, B: int, rng: np.random.Generator, resampling: str
) -> dict[tuple[str, str, str], np.ndarray]:
    """[B] replicate means (x100) of every cell."""
    shared = _stratified_weights(rng, B, C, data) if resampling == "clustered" else None
    per_cell: dict[tuple[str, str], np.ndarray] = {}
    out = {}
    for (w, h, m), d in data.items():
        if shared is not None:
            W = shared
        elif resampling == "cell":
            if (h, m) not in per_cell:
                per_cell[(h, m)] = _weights(rng, B, C, d.clusters)
            W = per_cell[(h, m)]
        else:
            W = _weights(rng, B, C, d.clusters)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[(w, h, m)] = (W @ d.sums) / (W @ d.counts) * 100  # nan: a draw without this cell's items
    return out


def _fill(t: MatrixTable, data: dict[tuple[str, str, str], _CellData], boots: dict) -> None:
    """Cells, harness scores, the Average and the differences, all from the same replicates."""
    for key, d in data.items():
        t.cells[key] = Cell(
            d.mean, *_ci(boots[key]), int(d.counts.sum()), d.writer_failures, d.excluded, d.truncated
        )
    hboot: dict[tuple[str, str], np.ndarray] = {}
    for w in t.writers:
        for h in t.harnesses:
            ms = t.mean_metrics(h)
            if not ms:
                continue
            with np.errstate(invalid="ignore"), _quiet():
                hboot[(w, h)] = np.nanmean(np.stack([boots[(w, h, m)] for m in ms]), axis=0)
            t.harness_scores[(w, h)] = _sum_cell([t.cells[(w, h, m)] for m in ms], hboot[(w, h)])
    aboot: dict[str, np.ndarray] = {}
    for w in t.writers:
        hs = [h for h in t.harnesses if (w, h) in hboot]
        if hs:
            with np.errstate(invalid="ignore"), _quiet():
                aboot[w] = np.nanmean(np.stack([hboot[(w, h)] for h in hs]), axis=0)
            t.average[w] = _sum_cell([t.harness_scores[(w, h)] for h in hs], aboot[w])
    for i, a in enumerate(t.writers):
        for b in t.writers[i + 1 :]:
            cols = [("Average", aboot.get(a), aboot.get(b), t.average.get(a), t.average.get(b))]
            cols += [
                (
                    h,
                    hboot.get((a, h)),
                    hboot.get((b, h)),
                    t.harness_scores.get((a, h)),
                    t.harness_scores.get((b, h)),
                )
                for h in t.harnesses
            ]
            for col, ba, bb, ca, cb in cols:
                if ba is not None and bb is not None and ca is not None and cb is not None:
                    t.diffs[(a, b, col)] = Cell(ca.mean - cb.mean, *_ci(ba - bb), min(ca.n, cb.n))


def _sum_cell(parts: list[Cell], boot: np.ndarray) -> Cell:
    """A mean over cells (equal weight, cells without items left out) with its replicates' interval."""
    vals = [c.mean for c in parts if c.n]
    return Cell(
        float(np.mean(vals)) if vals else math.nan,
        *_ci(boot),
        sum(c.n for c in parts),
        sum(c.writer_failures for c in parts),
        sum(c.excluded for c in parts),
        sum(c.truncated for c in parts),
    )


class _quiet:
    """numpy warns on an all-nan slice (a cell where every item failed); the nan is the answer."""

    def __enter__(self):
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        self._w.__exit__(*exc)


def _metric_order(m: str) -> tuple[int, str]:
    base = m.split(" (")[0]
    return (REPORT_METRICS.index(base) if base in REPORT_METRICS else len(REPORT_METRICS), m)


def harness_label(h: str, t: MatrixTable) -> str:
    return f"{h} (held out)" if t.held_out.get(h) else h


def to_markdown(t: MatrixTable, header: list[str]) -> str:
    L = ["# Writer-only swap matrix", "", *header, ""]
    L += [
        f"Scores x100, mean [95% interval, {RESAMPLING_LABEL[t.resampling]}]. A writer failure scores 0 "
        '("writer-failed"); a platform failure drops the item for every writer ("excluded"); "cut" counts '
        f"reader answers stopped at their token budget (TRUNCATION: above {TRUNCATION_FLAG:.0%} of the cell).",
        "",
    ]
    cols = [harness_label(h, t) for h in t.harnesses] + ["Average"]
    L += ["| Writer | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for w in t.writers:
        row = [t.harness_scores[(w, h)].fmt() if (w, h) in t.harness_scores else "-" for h in t.harnesses]
        row.append(t.average[w].fmt() if w in t.average else "-")
        L.append(f"| {w} | " + " | ".join(row) + " |")
    L.append("")
    for h in t.harnesses:
        ran, averaged = t.metrics.get(h, []), t.mean_metrics(h)
        report_ran = [m for m in averaged if base_metric(m) in REPORT_METRICS]
        left = [m for m in ran if m not in averaged]
        L.append(
            f"Harness score of {harness_label(h, t)}: mean of {', '.join(averaged) or 'no metric'} "
            f"({len(report_ran)} of the report's {len(REPORT_METRICS)} metrics)"
            + (f"; {', '.join(left)} shown per metric, out of the means (as the report)" if left else "")
            + "."
        )
    L.append("Average: the mean of the harness scores above.")
    L.append("")
    if t.diffs:
        L += ["## Differences between writers (paired bootstrap; an interval containing 0 is a tie)", ""]
        dcols = ["Average"] + [harness_label(h, t) for h in t.harnesses]
        L += ["| A - B | " + " | ".join(dcols) + " |", "|---" * (len(dcols) + 1) + "|"]
        pairs = sorted(
            {(a, b) for a, b, _ in t.diffs}, key=lambda p: (t.writers.index(p[0]), t.writers.index(p[1]))
        )
        for a, b in pairs:
            row = []
            for col in ["Average", *t.harnesses]:
                c = t.diffs.get((a, b, col))
                if c is None or math.isnan(c.mean) or math.isnan(c.lo):
                    row.append("-")
                else:
                    row.append(
                        f"{c.mean:+.2f} [{c.lo:+.2f}, {c.hi:+.2f}]" + (" tie" if c.lo <= 0 <= c.hi else "")
                    )
            L.append(f"| {a} - {b} | " + " | ".join(row) + " |")
        L.append("")
    if t.compare:
        L += _comparison(t)
    not_run = [
        m for m in REPORT_METRICS if not any(x.split(" (")[0] == m for ms in t.metrics.values() for x in ms)
    ]
    for h in t.harnesses:
        cols = t.metrics.get(h, [])
        L += [f"## {harness_label(h, t)}: per metric", ""]
        L += ["| Writer | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for w in t.writers:
            L.append(f"| {w} | " + " | ".join(t.cells[(w, h, m)].fmt() for m in cols) + " |")
        L.append("")
    if not_run:
        L += [
            "Not run: " + "; ".join(f"{m}: {NOT_RUN_REASONS.get(m, 'no data in this run')}" for m in not_run),
            "",
        ]
    if t.categories:
        L += ["## By question category (x100, items scored)", ""]
        L += ["| Writer | Harness | Metric | Category | Score | n |", "|---|---|---|---|---|---|"]
        for (w, h, m, c), (v, n) in sorted(
            t.categories.items(), key=lambda kv: (t.writers.index(kv[0][0]), kv[0][1:])
        ):
            L.append(f"| {w} | {harness_label(h, t)} | {m} | {c} | {v:.2f} | {n} |")
        L.append("")
    L += [f"- {n}" for n in t.notes]
    return "\n".join(L) + "\n"


def _comparison(t: MatrixTable) -> list[str]:
    """The table's intervals beside the same ones under another resampling, for writers and their pairs."""
    other = t.compare
    cols = ["Average", *t.harnesses]
    head = [
        f"{harness_label(c, t) if c != 'Average' else c}: {k}"
        for c in cols
        for k in (t.resampling, other["resampling"])
    ]
    L = [
        f"## Intervals side by side: {t.resampling} (the table's) and {other['resampling']}",
        "",
        f"{t.resampling}: {RESAMPLING_LABEL[t.resampling]}; {other['resampling']}: "
        f"{RESAMPLING_LABEL[other['resampling']]}. Same point estimates; only the intervals differ.",
        "",
        "| Row | " + " | ".join(head) + " |",
        "|---" * (len(head) + 1) + "|",
    ]

    sources = ((t.average, t.harness_scores), (other["average"], other["harness_scores"]))
    for w in t.writers:
        row = [_iv(avg.get(w) if c == "Average" else hs.get((w, c))) for c in cols for avg, hs in sources]
        L.append(f"| {w} | " + " | ".join(row) + " |")
    for a, b in sorted(
        {(a, b) for a, b, _ in t.diffs}, key=lambda p: (t.writers.index(p[0]), t.writers.index(p[1]))
    ):
        row = [_iv(d.get((a, b, c)), signed=True) for c in cols for d in (t.diffs, other["diffs"])]
        L.append(f"| {a} - {b} | " + " | ".join(row) + " |")
    return [*L, ""]


RESAMPLING_LABEL = {
    "clustered": "source sequences drawn once per replicate for every cell and writer",
    "cell": "each cell's items drawn on their own, writers paired within a cell",
    "unpaired": "every writer's cell drawn on its own",
}


def _iv(c: Cell | None, signed: bool = False) -> str:
    if c is None or math.isnan(c.lo):
        return "-"
    f = "{:+.2f}" if signed else "{:.2f}"
    return f"[{f.format(c.lo)}, {f.format(c.hi)}]"


def to_csv(t: MatrixTable) -> str:
    buf = io.StringIO()
    wr = csv.writer(buf)
    wr.writerow(
        [
            "writer",
            "harness",
            "metric",
            "mean",
            "ci_low",
            "ci_high",
            "n",
            "writer_failures",
            "excluded",
            "truncated",
        ]
    )
    rows = [(w, h, m, c) for (w, h, m), c in sorted(t.cells.items())]
    rows += [(w, h, "harness_score", c) for (w, h), c in sorted(t.harness_scores.items())]
    rows += [(w, "Average", "average", c) for w, c in t.average.items()]
    for w, h, m, c in rows:
        wr.writerow(
            [w, h, m, _r(c.mean), _r(c.lo), _r(c.hi), c.n, c.writer_failures, c.excluded, c.truncated]
        )
    return buf.getvalue()


def _r(x: float) -> str:
    return "" if math.isnan(x) else f"{x:.4f}"


def to_png(t: MatrixTable, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [*t.harnesses, "Average"]
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(groups) * max(1, len(t.writers)) / 2), 3.6))
    width = 0.8 / max(1, len(t.writers))
    for k, w in enumerate(t.writers):
        cells = [t.harness_scores.get((w, h)) for h in t.harnesses] + [t.average.get(w)]
        xs, ys, err = [], [], [[], []]
        for g, c in enumerate(cells):
            if c is None or c.n == 0:
                continue
            xs.append(g + (k - (len(t.writers) - 1) / 2) * width)
            ys.append(c.mean)
            err[0].append(max(0.0, c.mean - c.lo) if not math.isnan(c.lo) else 0.0)
            err[1].append(max(0.0, c.hi - c.mean) if not math.isnan(c.hi) else 0.0)
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=w)
    ax.set_xticks(
        range(len(groups)), [harness_label(g, t) if g != "Average" else g for g in groups], fontsize=8
    )
    ax.set_ylabel("score x100 (95% CI)")
    ax.set_title("Writer-only swap matrix")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(
    out: Path, t: MatrixTable, records: list[dict[str, Any]], header: list[str], extra: dict[str, Any]
) -> str:
    """table.md, table.csv, table.png, items.jsonl and summary.json under `out`; returns the markdown."""
    from data_pipeline.store import atomic_write_text

    md = to_markdown(t, header)
    atomic_write_text(out / "table.md", md)
    atomic_write_text(out / "table.csv", to_csv(t))
    atomic_write_text(out / "items.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    to_png(t, out / "table.png")
    summary = {
        "resampling": t.resampling,
        "average": {w: c.__dict__ for w, c in t.average.items()},
        "diffs": {f"{a}-{b}/{col}": c.__dict__ for (a, b, col), c in t.diffs.items()},
        "compare": {
            "resampling": t.compare.get("resampling"),
            "average": {w: c.__dict__ for w, c in t.compare.get("average", {}).items()},
            "diffs": {f"{a}-{b}/{col}": c.__dict__ for (a, b, col), c in t.compare.get("diffs", {}).items()},
        },
        "harness_scores": {f"{w}/{h}": c.__dict__ for (w, h), c in t.harness_scores.items()},
        "cells": {f"{w}/{h}/{m}": c.__dict__ for (w, h, m), c in t.cells.items()},
        **extra,
    }
    write_json_atomic(
        out / "summary.json", json.loads(json.dumps(summary, default=str).replace("NaN", "null"))
    )
    return md
