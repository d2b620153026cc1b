"""The matrix's tables: the report's layout (rows = writers, columns = harnesses + average; a per-metric
table per harness), bootstrap 95% intervals on every cell and on the differences between writers, and a
per-category breakdown. Scores are x100, as in the report.

A failed item (bank build, search, reader or judge failure) is excluded from its cell's mean and counted
next to it; it never scores 0 (silent failure platform-error-as-reward). A harness's score is the equal-weight mean of the
metrics that ran (the table says how many of the report's six); the average is over harnesses.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harnesses.base import write_json_atomic

# the report's six metrics, in its column order
REPORT_METRICS = ["LoCoMo Judge", "LongMemEval", "PersonaMem-v2", "Travel SPS", "Shopping PS", "CMB"]
# why a metric cannot run here at all (others that did not run had no data in this run)
NOT_RUN_REASONS = {
    "CMB": "no public CMB data or scorer found (docs/evaluation.md)",
}


@dataclass
class Cell:
    mean: float  # x100; nan when every item failed
    lo: float
    hi: float
    n: int  # items scored
    failures: int  # items excluded (counted, never scored)

    def fmt(self) -> str:
        if self.n == 0:
            return f"failed ({self.failures})" if self.failures else "-"
        s = f"{self.mean:.2f} [{self.lo:.2f}, {self.hi:.2f}]"
        return s + (f" ({self.failures} failed)" if self.failures else "")


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


def _ci(samples: np.ndarray) -> tuple[float, float]:
    s = samples[~np.isnan(samples)]
    if s.size == 0:
        return math.nan, math.nan
    return float(np.percentile(s, 2.5)), float(np.percentile(s, 97.5))


def build_table(
    records: list[dict[str, Any]], writers: list[str], harnesses: list[str], held_out: dict[str, bool],
    *, resamples: int = 1000, seed: int = 0,
) -> MatrixTable:  # fmt: skip
    """Cells, harness scores, averages and paired writer differences with percentile-bootstrap intervals.
    Resampling draws the same items for every writer (a paired bootstrap: they answered the same items)."""
    rng = np.random.default_rng(seed)
    B = max(resamples, 1)
    by: dict[tuple[str, str], dict[str, dict[str, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        by[(r["harness"], r["metric"])][r["writer"]][r["item_id"]] = r
    metrics: dict[str, list[str]] = defaultdict(list)
    for h, m in sorted(by, key=lambda k: (harnesses.index(k[0]), _metric_order(k[1]))):
        metrics[h].append(m)
    cells: dict[tuple[str, str, str], Cell] = {}
    boot: dict[tuple[str, str, str], np.ndarray] = {}  # (writer, harness, metric) -> B means
    categories: dict[tuple[str, str, str, str], tuple[float, int]] = {}
    for (h, m), per_writer in by.items():
        items = sorted({i for recs in per_writer.values() for i in recs})
        idx = rng.integers(0, len(items), size=(B, len(items)))
        for w in writers:
            recs = per_writer.get(w, {})
            s = np.array([recs[i]["score"] if i in recs and "score" in recs[i] else np.nan for i in items])
            n, fails = int((~np.isnan(s)).sum()), sum(1 for i in items if i in recs and "failure" in recs[i])
            with np.errstate(invalid="ignore"), _quiet():  # a resample of only failed items: nan
                means = np.nanmean(s[idx], axis=1) if n else np.full(B, np.nan)
            boot[(w, h, m)] = means * 100
            mean = float(np.nanmean(s) * 100) if n else math.nan
            lo, hi = _ci(means * 100)
            cells[(w, h, m)] = Cell(mean, lo, hi, n, fails)
            cat: dict[str, list[float]] = defaultdict(list)
            for i in items:
                if i in recs and "score" in recs[i]:
                    cat[recs[i].get("category", "")].append(recs[i]["score"])
            for c, v in cat.items():
                categories[(w, h, m, c)] = (float(np.mean(v) * 100), len(v))
    harness_scores: dict[tuple[str, str], Cell] = {}
    hboot: dict[tuple[str, str], np.ndarray] = {}
    for w in writers:
        for h in harnesses:
            ms = metrics.get(h, [])
            if not ms:
                continue
            stack = np.stack([boot[(w, h, m)] for m in ms])
            with np.errstate(invalid="ignore"), _quiet():
                hb = np.nanmean(stack, axis=0)
            hboot[(w, h)] = hb
            vals = [cells[(w, h, m)].mean for m in ms if cells[(w, h, m)].n]
            lo, hi = _ci(hb)
            harness_scores[(w, h)] = Cell(
                float(np.mean(vals)) if vals else math.nan, lo, hi,
                sum(cells[(w, h, m)].n for m in ms), sum(cells[(w, h, m)].failures for m in ms),
            )  # fmt: skip
    average: dict[str, Cell] = {}
    aboot: dict[str, np.ndarray] = {}
    for w in writers:
        hs = [h for h in harnesses if (w, h) in hboot]
        if not hs:
            continue
        with np.errstate(invalid="ignore"), _quiet():
            aboot[w] = np.nanmean(np.stack([hboot[(w, h)] for h in hs]), axis=0)
        vals = [harness_scores[(w, h)].mean for h in hs if harness_scores[(w, h)].n]
        lo, hi = _ci(aboot[w])
        average[w] = Cell(float(np.mean(vals)) if vals else math.nan, lo, hi,
                          sum(harness_scores[(w, h)].n for h in hs), sum(harness_scores[(w, h)].failures for h in hs))  # fmt: skip
    diffs: dict[tuple[str, str, str], Cell] = {}
    for i, a in enumerate(writers):
        for b in writers[i + 1 :]:
            pairs = [("Average", aboot.get(a), aboot.get(b), average.get(a), average.get(b))]
            pairs += [(h, hboot.get((a, h)), hboot.get((b, h)), harness_scores.get((a, h)), harness_scores.get((b, h)))
                      for h in harnesses]  # fmt: skip
            for col, ba, bb, ca, cb in pairs:
                if ba is None or bb is None or ca is None or cb is None:
                    continue
                lo, hi = _ci(ba - bb)
                diffs[(a, b, col)] = Cell(ca.mean - cb.mean, lo, hi, min(ca.n, cb.n), 0)
    return MatrixTable(
        writers, harnesses, held_out, dict(metrics), cells, harness_scores, average, diffs, categories
    )


class _quiet:
    """numpy warns on an all-nan slice (a cell where every item failed); the nan is the answer."""

    def __enter__(self):
        import warnings

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
        "Scores x100, mean [bootstrap 95% interval]; failed items are excluded and counted, never scored 0.",
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
        ran = t.metrics.get(h, [])
        report_ran = [m for m in ran if m.split(" (")[0] in REPORT_METRICS]
        L.append(f"Harness score of {harness_label(h, t)}: mean over {len(ran)} metric(s) that ran "
                 f"({len(report_ran)} of the report's {len(REPORT_METRICS)}).")  # fmt: skip
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
            "Not run: "
            + "; ".join(f"{m} ({NOT_RUN_REASONS.get(m, 'no data in this run')})" for m in not_run),
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


def to_csv(t: MatrixTable) -> str:
    buf = io.StringIO()
    wr = csv.writer(buf)
    wr.writerow(["writer", "harness", "metric", "mean", "ci_low", "ci_high", "n", "failures"])
    for (w, h, m), c in sorted(t.cells.items()):
        wr.writerow([w, h, m, _r(c.mean), _r(c.lo), _r(c.hi), c.n, c.failures])
    for (w, h), c in sorted(t.harness_scores.items()):
        wr.writerow([w, h, "harness_score", _r(c.mean), _r(c.lo), _r(c.hi), c.n, c.failures])
    for w, c in t.average.items():
        wr.writerow([w, "Average", "average", _r(c.mean), _r(c.lo), _r(c.hi), c.n, c.failures])
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


def write_outputs(out: Path, t: MatrixTable, records: list[dict[str, Any]], header: list[str],
                  extra: dict[str, Any]) -> str:  # fmt: skip
    """table.md, table.csv, table.png, items.jsonl and summary.json under `out`; returns the markdown."""
    from data_pipeline.store import atomic_write_text

    md = to_markdown(t, header)
    atomic_write_text(out / "table.md", md)
    atomic_write_text(out / "table.csv", to_csv(t))
    atomic_write_text(out / "items.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    to_png(t, out / "table.png")
    summary = {
        "average": {w: c.__dict__ for w, c in t.average.items()},
        "harness_scores": {f"{w}/{h}": c.__dict__ for (w, h), c in t.harness_scores.items()},
        "cells": {f"{w}/{h}/{m}": c.__dict__ for (w, h, m), c in t.cells.items()},
        **extra,
    }
    write_json_atomic(
        out / "summary.json", json.loads(json.dumps(summary, default=str).replace("NaN", "null"))
    )
    return md
