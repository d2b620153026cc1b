"""Reader self-checks: does the served reader read the bank? Four figures over a ledger-world dataset's
probes, each bank shown to the reader as the search results of a real native bank (harnesses/native.py,
filled through its own write path, searched with the run's search_k):

- gold: the gold bank after the probe's chunk (data_pipeline.ledger.gold_records) answers the non-trap
  probes correctly (exact match, normalise_atomic): >= GOLD_MIN;
- empty: an empty bank answers them correctly: <= EMPTY_MAX (a reader that knows the answers without
  the bank has learnt the data, not to read);
- permuted: the gold bank with every current value changed (each replaced by the next value of its
  attribute, a derangement) gets the permuted value back: >= PERMUTED_MIN (a reader answering from
  what it memorised fails here);
- polluted: the gold bank plus the small talk a careless writer stores (transient_records) makes the
  trap probes fail (an answer other than "no such record"): >= POLLUTED_MIN (a reader that says "no
  such record" whatever the bank holds fails here; the traps must be able to punish a writer).

A reader call that faults fails its check (a reader that cannot answer the preflight is not one to
trust). `preflight` raises `ReaderPreflightError` naming each failing check with its figure and
threshold; `preflight_to` runs it on every ledger-world dataset of a run and writes the figures to a
JSON file first, `<run_dir>/reader_preflight.json`:

    {"passed": bool,
     "checks": {name: {"value", "rule" (">= 0.95"), "threshold", "op", "num_items", "num_faults",
                       "passed"}},          the run's figure of each check: its worst dataset's
     "datasets": [{"root", "harnesses", "passed", "search_k", "num_sequences", "num_probes",
                   "num_traps", "seconds", "checks": {...}}]}
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from data_pipeline.ledger import ATTR_BY_NAME, gold_records, parse_record, transient_records
from data_pipeline.schema import NO_SUCH_RECORD
from harnesses.base import write_json_atomic
from harnesses.native import NativeHarness
from reward.judge import Reader, normalise_atomic
from reward.llm import Fault

log = logging.getLogger(__name__)

LEDGER_SOURCE = "synthetic_ledger"  # Sequence.source of the ledger world
GOLD_MIN = 0.95
EMPTY_MAX = 0.05
PERMUTED_MIN = 0.95
POLLUTED_MIN = 0.95
# check -> (threshold, how the figure must compare with it)
CHECKS = {
    "gold": (GOLD_MIN, ">="),
    "empty": (EMPTY_MAX, "<="),
    "permuted": (PERMUTED_MIN, ">="),
    "polluted": (POLLUTED_MIN, ">="),
}
_PROBE_KEY_RE = re.compile(r"^What is (?P<key>.+)\?$")  # the ledger world's probe form


class ReaderPreflightError(RuntimeError):
    """The served reader failed a self-check: its scores would not measure the bank."""


@dataclass(frozen=True)
class CheckFigure:
    name: str  # "gold" | "empty" | "permuted" | "polluted"
    value: float  # the share measured (nan when no item was answered)
    threshold: float  # the bound it must meet
    op: str  # ">=" or "<=": how the value compares with the threshold to pass
    num_items: int  # probes asked
    num_faults: int  # reader calls that faulted (each fails the check)
    passed: bool

    @property
    def rule(self) -> str:
        return f"{self.op} {self.threshold}"

    def line(self) -> str:
        faults = f", {self.num_faults} reader faults" if self.num_faults else ""
        verdict = "ok" if self.passed else "FAILED"
        # a check with nothing to ask cannot vouch for the reader: say so rather than print a bare nan
        empty = " - the data holds none it could ask" if not self.num_items else ""
        return f"{self.name}: {self.value:.3f} (want {self.rule}, {self.num_items} probes{empty}{faults}) {verdict}"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["value"] = None if math.isnan(self.value) else self.value  # strict JSON has no NaN
        d["rule"] = self.rule
        return d


@dataclass
class ReaderChecks:
    """The four figures of one dataset."""

    root: str  # the built dataset
    search_k: int  # memories retrieved per probe
    num_sequences: int  # ledger sequences checked
    num_probes: int  # non-trap probes (gold, empty, permuted)
    num_traps: int  # trap probes (polluted)
    checks: dict[str, CheckFigure] = field(default_factory=dict)  # name -> figure
    seconds: float = 0.0  # wall time of the checks (banks, searches, reader calls)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks.values())

    def failures(self) -> list[CheckFigure]:
        return [c for c in self.checks.values() if not c.passed]

    def summary(self) -> str:
        head = (
            f"reader self-checks on {self.root} ({self.num_sequences} sequences, {self.num_probes} probes, "
            f"{self.num_traps} traps, search_k={self.search_k}):"
        )
        return "\n".join([head] + [f"  {c.line()}" for c in self.checks.values()])

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["checks"] = {n: c.to_json() for n, c in self.checks.items()}
        d["passed"] = self.passed
        return d


def is_ledger_dataset(ds: Any) -> bool:
    """Whether a BuiltDataset holds ledger-world sequences (the checks need its record grammar)."""
    return any(s.source == LEDGER_SOURCE for s in ds.tables["sequences"])


def permuted_value(key: str, value: str) -> str:
    """The permuted bank's value for a key ("Alice's city" or "city"): the next value of its attribute
    (cyclic), never `value` itself."""
    attr = ATTR_BY_NAME.get(key.rsplit("'s ", 1)[-1].strip().casefold())
    if attr is None:
        raise ValueError(f"reader checks: key {key!r} names no ledger attribute")
    vals = [v.casefold() for v in attr.values]
    i = vals.index(value.casefold()) if value.casefold() in vals else -1
    return attr.values[(i + 1) % len(vals)]


def permute_records(records: Sequence[str]) -> list[str]:
    """Every record with its current (last) state's value permuted; its key and earlier states kept."""
    out = []
    for text in records:
        r = parse_record(text)
        if r is None:
            raise ValueError(f"reader checks: gold record {text!r} does not parse")
        states = [*r.states[:-1], (permuted_value(r.key, r.current), r.states[-1][1])]
        out.append(f"{r.key}: " + ", then ".join([states[0][0]] + [f"{v} ({d})" for v, d in states[1:]]))
    return out


class _Bank:
    """One native bank kept in step with a list of records through the harness's own write path (no
    LLM): a changed record is an UPDATE of its key's entry, as a writer's would be."""

    def __init__(self, root: Path, search_k: int):
        self.root, self.k = root, search_k
        self.harness = NativeHarness(None)
        self.n = 0
        self.ids: dict[str, list[int]] = {}  # record text -> the entry ids holding it

    def reset(self) -> None:
        """A fresh empty bank (the next sequence's)."""
        self.harness.close()
        self.n += 1
        self.harness.open(self.root / f"bank_{self.n:04d}", create=True)
        self.ids = {}

    def set(self, records: Sequence[str], session_id: str, date: str, t: int) -> None:
        held = [(i, text) for text, ids in self.ids.items() for i in ids]
        want = list(records)
        for i, text in list(held):  # entries already right stay as they are
            if text in want:
                want.remove(text)
                held.remove((i, text))
        ops: list[dict[str, Any]] = []
        for text in want:
            key = _key(text)
            old = next(((i, h) for i, h in held if _key(h) == key), None)
            if old is not None:
                held.remove(old)
                ops.append({"op": "UPDATE", "id": old[0], "text": text})
            else:
                ops.append({"op": "ADD", "text": text})
        ops += [{"op": "DELETE", "id": i} for i, _ in held]
        if not ops:
            return
        res = self.harness.apply_ops(json.dumps({"ops": ops}), session_id, date, chunk_index=t)
        if not res.ok or res.error:
            raise RuntimeError(f"reader checks: writing {self.root} failed: {res}")
        self.ids = {}
        for e in self.harness.read_all():
            self.ids.setdefault(e.text, []).append(int(e.id))
        if sorted(self.ids) != sorted(set(records)) or self.harness.count() != len(records):
            raise RuntimeError(
                f"reader checks: bank {self.root} holds {sorted(self.ids)}, not {sorted(records)}"
            )

    def search(self, questions: Sequence[str]) -> list[list[Any]]:
        return [self.harness.search(q, self.k) for q in questions]

    def close(self) -> None:
        self.harness.shutdown()


def _scratch_dir() -> str | None:
    """tmpfs when there is one: the banks are scratch, and their fsyncs cost ~10x the checks on a disk."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _key(text: str) -> str:
    r = parse_record(text)
    return r.key if r is not None else text


def reader_checks(
    ds: Any, reader: Reader, *, search_k: int, work_dir: str | Path | None = None, max_sequences: int = 0
) -> ReaderChecks:
    """The four figures of a ledger-world BuiltDataset (`max_sequences` > 0: its first N sequences)."""
    t0 = time.perf_counter()
    seqs = sorted(s.sequence_id for s in ds.tables["sequences"] if s.source == LEDGER_SOURCE)
    if not seqs:
        raise ValueError(
            f"reader checks: {ds.root} holds no ledger-world sequence (source {LEDGER_SOURCE!r})"
        )
    seqs = seqs[:max_sequences] if max_sequences > 0 else seqs
    chunks: dict[str, list[Any]] = {s: [] for s in seqs}
    for c in ds.tables["chunks"]:
        if c.sequence_id in chunks:
            chunks[c.sequence_id].append(c)
    probes: dict[tuple[str, int], list[Any]] = {}
    for p in ds.tables["probes"]:
        if p.sequence_id in chunks:
            probes.setdefault((p.sequence_id, p.chunk_index), []).append(p)
    # (check, where, question, search results, expected answer); one batched reader round for all
    items: list[tuple[str, str, str, list[Any], str]] = []
    with tempfile.TemporaryDirectory(prefix="reader_checks_", dir=work_dir or _scratch_dir()) as tmp:
        banks = {name: _Bank(Path(tmp) / name, search_k) for name in CHECKS}
        try:
            banks["empty"].reset()  # one empty bank serves every sequence
            for sid in seqs:
                for name in ("gold", "permuted", "polluted"):
                    banks[name].reset()
                for c in sorted(chunks[sid], key=lambda c: c.index):
                    gold = gold_records(chunks[sid], upto=c.index)
                    session = c.session_ids[0] if c.session_ids else f"chunk_{c.index}"
                    here = probes.get((sid, c.index), [])
                    recall = [p for p in here if not p.is_trap]
                    traps = [p for p in here if p.is_trap]
                    for name, records, asked in (
                        ("gold", gold, recall),
                        ("empty", [], recall),
                        ("permuted", permute_records(gold), recall),
                        ("polluted", gold + transient_records(chunks[sid], upto=c.index), traps),
                    ):
                        banks[name].set(records, session, c.date, c.index)
                        found = banks[name].search([p.question for p in asked])
                        for p, entries in zip(asked, found, strict=True):
                            items.append(
                                (
                                    name,
                                    f"reader check {name} / probe {p.probe_id}",
                                    p.question,
                                    entries,
                                    _expected(name, p),
                                )
                            )
        finally:
            for b in banks.values():
                b.close()
    answers = reader.answer_all([(where, q, entries) for _, where, q, entries, _ in items])
    out = ReaderChecks(
        root=str(ds.root),
        search_k=search_k,
        num_sequences=len(seqs),
        num_probes=sum(not p.is_trap for v in probes.values() for p in v),
        num_traps=sum(p.is_trap for v in probes.values() for p in v),
    )
    for name, (threshold, op) in CHECKS.items():
        got = [(a, exp) for (n, *_, exp), a in zip(items, answers, strict=True) if n == name]
        answered = [(a, exp) for a, exp in got if not isinstance(a, Fault)]
        faults = len(got) - len(answered)
        if name == "polluted":  # a trap fails when the answer names anything
            hits = [normalise_atomic(a) != NO_SUCH_RECORD for a, _ in answered]
        else:
            hits = [normalise_atomic(a) == normalise_atomic(exp) for a, exp in answered]
        value = sum(hits) / len(hits) if hits else float("nan")
        ok = bool(hits) and not faults and (value >= threshold if op == ">=" else value <= threshold)
        out.checks[name] = CheckFigure(name, value, threshold, op, len(got), faults, ok)
    out.seconds = time.perf_counter() - t0
    return out


def _worst(figs: list[CheckFigure]) -> CheckFigure:
    """The run's figure of a check: its worst dataset's (a failed one first)."""
    return min(figs, key=lambda c: (c.passed, c.value if c.op == ">=" else -c.value))


def _expected(check: str, probe: Any) -> str:
    if check == "polluted":
        return NO_SUCH_RECORD  # what the gold bank would answer; the check counts answers that differ
    if check == "permuted":
        m = _PROBE_KEY_RE.match(probe.question)
        if m is None:
            raise ValueError(
                f"reader checks: probe {probe.probe_id} {probe.question!r} is not a ledger probe"
            )
        return permuted_value(m.group("key"), probe.reference)
    return probe.reference


def preflight(ds: Any, reader: Reader, *, search_k: int, **kw: Any) -> ReaderChecks:
    """`reader_checks`, raising ReaderPreflightError when any check fails."""
    res = reader_checks(ds, reader, search_k=search_k, **kw)
    raise_if_failed(res)
    return res


def raise_if_failed(res: ReaderChecks) -> None:
    bad = res.failures()
    if bad:
        raise ReaderPreflightError(
            f"reader preflight failed on {res.root}: "
            + "; ".join(c.line() for c in bad)
            + ". The reader's scores would not measure the bank (reward/reader_checks.py); serve a reader "
            "that reads (reader_kind=extractive) or set reader_preflight=false to run anyway"
        )


def preflight_to(
    path: str | Path,
    datasets: dict[str, Any],
    reader: Reader,
    *,
    search_k: int,
    echo: Callable[[str], None] | None = None,
    **kw: Any,
) -> list[ReaderChecks]:
    """The checks on every ledger-world dataset of a run (harness name -> BuiltDataset; a dataset several
    harnesses share is checked once), written to `path` (JSON), logged and passed to `echo`, then
    ReaderPreflightError if any check failed. Returns [] (and writes nothing) when no dataset is a
    ledger-world one."""
    by_root: dict[str, tuple[Any, list[str]]] = {}
    for h, ds in datasets.items():
        if is_ledger_dataset(ds):
            by_root.setdefault(str(Path(ds.root).resolve()), (ds, []))[1].append(h)
    results = []
    for ds, harnesses in by_root.values():
        res = reader_checks(ds, reader, search_k=search_k, **kw)
        log.info("%s", res.summary())
        if echo is not None:
            echo(res.summary())
        results.append((res, harnesses))
    if not results:
        return []
    rec = {
        "passed": all(r.passed for r, _ in results),
        "checks": {name: _worst([r.checks[name] for r, _ in results]).to_json() for name in CHECKS},
        "datasets": [{**r.to_json(), "harnesses": hs} for r, hs in results],
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(path), rec)
    for r, _ in results:
        raise_if_failed(r)
    return [r for r, _ in results]
