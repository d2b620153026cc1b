"""The writer-only swap matrix: for each (writer, harness, sequence) a bank built from empty by the writer
through the harness's own write path, then every planned question of that sequence searched, read by
the fixed reader and scored by its benchmark's protocol (reward/eval_protocol.py).

Resumable (nothing paid twice): a bank build commits a copy of the closed bank after every chunk
(`ckpt/`, with its progress inside, renamed into place) and `build.json` when done; each scored item
is appended to the unit's `items.jsonl` as soon as its batch is judged. A rerun skips what is there.

Failures (silent failure platform-error-as-reward), each item's record says which class (docs/evaluation.md):
- platform: a bank build that still fails on the harness, its sandbox, its store or the network after
  the harness's own retries and `build_retries` re-attempts; a failed search; a reader or judge call
  that failed after its retries. The report drops the item for every writer.
- writer: a bank build ended by the writer itself (its endpoint timed out on a write). The report
  scores the item 0 for that writer. A malformed write is not a failure at all: the build goes on
  and the bank holds what the writer managed.
Any other exception is a bug and stops the run (the unit is redone on the next run).

Layout: <out>/plan.json, <out>/cache/<writer>/<harness>/<sequence>/{bank,ckpt,build.json,items.jsonl};
build.json holds the build's op mix (`ops`, reward.bank_metrics.op_counts) beside its status.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from data_pipeline.chunking import iso_date
from data_pipeline.source_gold import has_gold
from data_pipeline.store import BuiltDataset
from harnesses.base import Endpoint, HarnessError, PlatformError, WriteStatus, write_json_atomic
from harnesses.registry import HarnessConfig, get_spec, make_harness
from hymem_train.evaluation.config import MatrixConfig, WriterConfig, writer_sampling
from hymem_train.rollout.worker import chunk_messages, kill_sandboxes_until
from reward.bank_metrics import op_counts
from reward.eval_protocol import Metric, Verdict, metric_for, token_f1_metric
from reward.judge import parse_answer
from reward.llm import ChatClient, ChatRequest, Fault

log = logging.getLogger(__name__)

PROGRESS_FILE = ".eval_progress.json"  # inside ckpt/: the copy and its progress are renamed together


class StaticWriter:
    """A writer reached at one endpoint for every bank build (checkpoint writers, endpoint writers)."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint

    def begin(self, unit: Unit) -> Endpoint:
        return self.endpoint

    def chunk(self, unit: Unit, chunk_index: int) -> None:
        pass

    def end(self, unit: Unit) -> None:
        pass


class EmptyWriter(StaticWriter):
    """The bound "store nothing" row (`kind: empty`): each bank is created and nothing is written."""

    stores_nothing = True

    def __init__(self):
        super().__init__(None)


class WriterLeakError(RuntimeError):
    """A writer served a call outside the write path (report: only the writer changes)."""


class WriterFailure(RuntimeError):
    """The writer itself ended a bank build (its endpoint timed out): scored 0, never excused."""


PLATFORM, WRITER = "platform", "writer"
# the platform's own failures: the harness, its sandbox process, its store, the network
PLATFORM_ERRORS: tuple[type[BaseException], ...] = (
    HarnessError,
    OSError,
    sqlite3.Error,
    subprocess.SubprocessError,
    httpx.TransportError,
)


@dataclass
class PlannedItem:
    item: Any  # data_pipeline.schema.EvalItem
    metric: Metric


@dataclass
class HarnessPlan:
    harness: str
    dataset: BuiltDataset
    items: dict[str, list[PlannedItem]]  # sequence_id -> its planned items
    benchmarks: list[str]


@dataclass
class Endpoints:
    """What serves which call kind (recorded in <out>/endpoints.json)."""

    # writer name -> its write path: an Endpoint, or a session (begin(unit) -> Endpoint, chunk(unit, i),
    # end(unit)) such as a training stage's own gateway, where each bank build is a registered identity
    writers: dict[str, Any]
    embedder: Endpoint | None  # the fixed embedder (write and search time)
    search: Endpoint | None  # the harnesses' own search-time LLM calls (a fixed endpoint or none)
    reader: Any  # LlmClientConfig
    judge: Any  # LlmClientConfig
    # writer name -> () -> requests served so far (local checkpoint writers: the gateway's counter)
    served: dict[str, Callable[[], int]] = field(default_factory=dict)


def safe(name: str) -> str:
    return name.replace("/", "_").replace(":", "_")


# ------------------------------------------------------------------------------------------ plan
def plan_matrix(cfg: MatrixConfig) -> list[HarnessPlan]:
    """The planned items per harness: the build's fixed subsample of each benchmark (the same items for
    every writer), cut to `max_items_per_benchmark` when set."""
    plans = []
    datasets: dict[str, BuiltDataset] = {}
    for h in cfg.harnesses:
        root = str(Path(cfg.data.of(h)).resolve())
        ds = datasets.setdefault(root, BuiltDataset(root))
        items = ds.tables["eval_items"]
        present = sorted({it.benchmark for it in items})
        wanted = list(cfg.benchmarks) or present
        unknown = [b for b in wanted if b not in present]
        if unknown:
            raise ValueError(f"harness {h}: benchmark(s) {unknown} not in {root} (it has {present})")
        by_id = {it.item_id: it for it in items}
        per_seq: dict[str, list[PlannedItem]] = {}
        for b in wanted:
            metric = metric_for(b)
            if cfg.protocol.judge_mode == "token_f1" and metric.judge_messages is not None:
                metric = token_f1_metric(metric)
            if metric.needs_atomic and not ds.manifest.answers_atomic:
                raise ValueError(
                    f"{root}: benchmark {b} is scored by exact match, which needs answers_atomic in the manifest"
                )
            if cfg.subsample == "fixed":
                sub = ds.manifest.eval_subsample.get("ids", {})
                if b not in sub:
                    raise ValueError(
                        f"{root}: the manifest has no fixed subsample for {b} (rebuild the dataset)"
                    )
                ids = list(sub[b])
            else:
                ids = sorted(it.item_id for it in items if it.benchmark == b)
            chosen = [by_id[i] for i in ids if metric.counts(by_id[i])]
            if cfg.max_items_per_benchmark:
                chosen = chosen[: cfg.max_items_per_benchmark]
            for it in chosen:
                per_seq.setdefault(it.sequence_id, []).append(PlannedItem(it, metric))
        plans.append(HarnessPlan(h, ds, per_seq, wanted))
    check_bound_writers(cfg, plans)
    return plans


LEDGER_SOURCE = "synthetic_ledger"  # Sequence.source of the ledger world (data_pipeline/ledger.py)


def ledger_sequences(p: HarnessPlan) -> bool:
    """Whether every planned sequence of the plan is a ledger-world sequence."""
    source = {s.sequence_id: s.source for s in p.dataset.tables["sequences"]}
    return bool(p.items) and all(source.get(q) == LEDGER_SOURCE for q in p.items)


def check_bound_writers(cfg: MatrixConfig, plans: list[HarnessPlan]) -> None:
    """The gold writer knows the gold ops of ledger-world chunks (the native harness) and the gold
    memories of real data that has them (observations or evidence turns, data_pipeline/source_gold.py);
    each framework's harnesses must write one dataset, since the writer tells them apart by prompt only."""
    gold = [w.name for w in cfg.writers if w.kind == "gold"]
    if not gold:
        return
    bad, roots = [], {}
    for p in plans:
        fw = cfg.harnesses[p.harness].framework
        roots.setdefault(fw, set()).add(str(p.dataset.root))
        if ledger_sequences(p):
            if fw != "native":
                bad.append(f"{p.harness}: ledger data is written by the native harness only, not {fw}")
        elif not has_gold(p.dataset):
            bad.append(f"{p.harness}: {p.dataset.root} has no gold memories (no facts, no has_answer turns)")
    shared = {fw: sorted(r) for fw, r in roots.items() if len(r) > 1}
    if shared:
        bad.append(f"harnesses of one framework write different datasets {shared}; split the run")
    if bad:
        raise ValueError(f"writer(s) {gold}, kind=gold: " + "; ".join(bad))


def gold_datasets(cfg: MatrixConfig, plans: list[HarnessPlan]) -> dict[str, BuiltDataset]:
    """framework -> the dataset its harnesses write (one per framework: check_bound_writers)."""
    return {cfg.harnesses[p.harness].framework: p.dataset for p in plans}


def plan_record(plans: list[HarnessPlan], cfg: MatrixConfig) -> dict[str, Any]:
    return {
        "subsample": cfg.subsample,
        "max_items_per_benchmark": cfg.max_items_per_benchmark,
        "judge_mode": cfg.protocol.judge_mode,
        "harnesses": {
            p.harness: {
                "dataset": str(p.dataset.root),
                "writer_decoding": writer_sampling(cfg.harnesses[p.harness]),
                "eval_subsample": {k: v for k, v in p.dataset.manifest.eval_subsample.items() if k != "ids"},
                "items": sorted(pi.item.item_id for its in p.items.values() for pi in its),
            }
            for p in plans
        },
    }


def check_plan(out: Path, record: dict[str, Any]) -> None:
    """A resumed matrix must score the same items as before (every writer, the same items)."""
    path = out / "plan.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old != record:
            raise ValueError(
                f"{path}: this run's plan (items, subsample, judge mode, the writer's decoding) differs from the one its cache was "
                "built with; use another run.output_dir or delete the directory"
            )
    else:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, record)


def writer_identity(w: WriterConfig) -> dict[str, Any]:
    """What a writer's cached banks were built by. A checkpoint is named by its path and its files' sizes
    and modification times, so a checkpoint retrained in place is not taken for the one cached."""
    ident: dict[str, Any] = {"kind": w.kind, "preset": w.preset}
    if w.checkpoint:
        root = Path(w.checkpoint).resolve()
        files = sorted(f for f in root.rglob("*") if f.is_file()) if root.is_dir() else []
        ident["checkpoint"] = str(root)
        ident["files"] = [[str(f.relative_to(root)), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    if w.base_url:
        ident["endpoint"] = [w.base_url, w.model]
    return ident


def check_writer(out: Path, w: WriterConfig) -> None:
    """A writer's cache is resumed only by the same writer: the cache is keyed by the writer's name, and
    another checkpoint under an old name would otherwise be scored with the old one's banks (silent
    failure cache-under-another-writer)."""
    path = out / "cache" / safe(w.name) / "writer.json"
    ident = writer_identity(w)
    if path.exists():
        if json.loads(path.read_text()) != ident:
            raise ValueError(
                f"{path}: writer {w.name!r} is not the writer its cached banks were built by (another "
                "checkpoint, a retrained one, or another endpoint); use another run.output_dir or delete the directory"
            )
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, ident)


# ------------------------------------------------------------------------------------------ builds
@dataclass
class Unit:
    writer: WriterConfig
    harness: str
    sequence_id: str
    dir: Path
    items: list[PlannedItem]

    @property
    def label(self) -> str:
        return f"{self.writer.name}/{self.harness}/{self.sequence_id}"


def build_bank(
    unit: Unit,
    chunks: list[Any],
    hcfg: HarnessConfig,
    writer: Any,
    embedder: Endpoint | None,
    *,
    retries: int,
    kill: bool = False,
    counters: Counter | None = None,
) -> dict[str, Any]:
    """The unit's bank from empty, chunk by chunk; resumes from the last committed chunk."""
    done = unit.dir / "build.json"
    if done.exists():
        return json.loads(done.read_text())
    unit.dir.mkdir(parents=True, exist_ok=True)
    if getattr(writer, "stores_nothing", False):
        return build_empty_bank(unit, hcfg, embedder)
    bank, ckpt = unit.dir / "bank", unit.dir / "ckpt"
    t0 = time.perf_counter()
    error, cls = "", PLATFORM
    for attempt in range(retries + 1):
        start, writes = restore(bank, ckpt)
        llm = writer.begin(unit)
        harness = make_harness(
            hcfg, llm, embedder, sandbox_root=unit.dir, sandbox_id=f"build-{uuid.uuid4().hex[:8]}"
        )
        stop = threading.Event()
        if kill:  # fault injection: every sandbox this build starts dies
            threading.Thread(target=kill_sandboxes_until, args=(harness, stop), daemon=True).start()
        try:
            harness.open(bank, create=start == 0)
            for chunk in chunks[start:]:
                writer.chunk(unit, chunk.index)
                res = harness.write_chunk(
                    chunk_messages(chunk),
                    chunk.session_ids[0] if chunk.session_ids else chunk.chunk_id,
                    iso_date(chunk.date),
                    chunk_index=chunk.index,
                )
                if counters is not None:
                    counters["write_calls"] += res.num_llm_calls
                if res.status is WriteStatus.PLATFORM_ERROR:
                    exc = WriterFailure if res.writer_timeout else PlatformError
                    raise exc(f"chunk {chunk.index}: {res.error}")
                writes.append(res.to_json())
                harness.close()
                commit(bank, ckpt, len(writes), writes)
                harness.open(bank)
            harness.close()
            statuses = Counter(w["status"] for w in writes)
            out = {
                "status": "ok",
                "chunks": len(writes),
                "seconds": time.perf_counter() - t0,
                "llm_calls": sum(w["num_llm_calls"] for w in writes),
                "write_statuses": dict(statuses),
                "attempts": attempt + 1,
                "ops": op_counts(writes),
            }
            write_json_atomic(done, out)
            shutil.rmtree(ckpt, ignore_errors=True)
            return out
        except WriterFailure as e:  # the writer's own: not retried, scored 0
            error, cls = f"{type(e).__name__}: {e}", WRITER
            log.warning("%s: bank build ended by the writer: %s", unit.label, error)
            break
        except PLATFORM_ERRORS as e:  # retried from the last committed chunk
            error, cls = f"{type(e).__name__}: {e}", PLATFORM
            log.warning("%s: bank build attempt %d failed: %s", unit.label, attempt + 1, error)
        finally:
            stop.set()
            release_harness(harness)
            writer.end(unit)
    out = {
        "status": "failed",
        "error": error,
        "failure_class": cls,
        "seconds": time.perf_counter() - t0,
        "attempts": attempt + 1,
    }
    write_json_atomic(done, out)
    return out


def release_harness(h) -> None:
    """Close a harness's bank (a close error is moot once the work is done or failed) and stop its
    process, if it runs one."""
    with contextlib.suppress(Exception):
        h.close()
    shutdown = getattr(h, "shutdown", None)
    if callable(shutdown):
        shutdown()


def build_empty_bank(unit: Unit, hcfg: HarnessConfig, embedder: Endpoint | None) -> dict[str, Any]:
    """The "store nothing" bound: the harness creates the bank and no chunk is written to it."""
    t0 = time.perf_counter()
    bank = unit.dir / "bank"
    shutil.rmtree(bank, ignore_errors=True)
    h = make_harness(hcfg, None, embedder, sandbox_root=unit.dir, sandbox_id=f"build-{uuid.uuid4().hex[:8]}")
    try:
        h.open(bank, create=True)
        h.close()  # an error here is the build's: it propagates
    finally:
        release_harness(h)
    out = {
        "status": "ok",
        "chunks": 0,
        "seconds": time.perf_counter() - t0,
        "llm_calls": 0,
        "write_statuses": {},
        "attempts": 1,
        "ops": op_counts([]),
    }
    write_json_atomic(unit.dir / "build.json", out)
    return out


def restore(bank: Path, ckpt: Path) -> tuple[int, list[dict[str, Any]]]:
    """The working bank as of the last committed chunk (or nothing, to start from empty)."""
    shutil.rmtree(bank, ignore_errors=True)
    for stale in bank.parent.glob("ckpt.*"):
        shutil.rmtree(stale, ignore_errors=True)
    if not (ckpt / PROGRESS_FILE).exists():
        shutil.rmtree(ckpt, ignore_errors=True)
        return 0, []
    progress = json.loads((ckpt / PROGRESS_FILE).read_text())
    shutil.copytree(ckpt, bank)
    (bank / PROGRESS_FILE).unlink()
    return int(progress["chunks_done"]), list(progress["writes"])


def commit(bank: Path, ckpt: Path, chunks_done: int, writes: list[dict[str, Any]]) -> None:
    """Copy the closed bank with its progress, then swap it in with renames (never a half checkpoint)."""
    tmp = ckpt.with_name(f"ckpt.{uuid.uuid4().hex[:6]}")
    shutil.copytree(bank, tmp, ignore=shutil.ignore_patterns("bank.lock"))
    write_json_atomic(tmp / PROGRESS_FILE, {"chunks_done": chunks_done, "writes": writes})
    old = ckpt.with_name(f"ckpt.old{uuid.uuid4().hex[:6]}")
    if ckpt.exists():
        os.rename(ckpt, old)
    os.rename(tmp, ckpt)
    shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------ answers
def read_done(path: Path) -> dict[str, dict[str, Any]]:
    """Items already scored (a torn last line from a kill is ignored and that item redone)."""
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            out[rec["item_id"]] = rec
    return out


def append_records(path: Path, records: list[dict[str, Any]]) -> None:
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def base_record(unit: Unit, pi: PlannedItem) -> dict[str, Any]:
    it = pi.item
    return {
        "writer": unit.writer.name,
        "harness": unit.harness,
        "benchmark": it.benchmark,
        "metric": pi.metric.column,
        "item_id": it.item_id,
        "sequence_id": it.sequence_id,
        "category": pi.metric.category_label(it.category),
        "question": it.question,
        "reference": it.answer,
    }


def answer_unit(
    unit: Unit,
    build: dict[str, Any],
    hcfg: HarnessConfig,
    endpoints: Endpoints,
    k: int,
    readers: dict[str, ChatClient],
    judges: dict[str, ChatClient],
) -> list[dict[str, Any]]:
    """Search, read and score the unit's pending items; appends them to items.jsonl and returns them."""
    path = unit.dir / "items.jsonl"
    done = read_done(path)
    pending = [pi for pi in unit.items if pi.item.item_id not in done]
    if not pending:
        return []
    if build["status"] != "ok":
        fail = {
            "stage": "bank_build",
            "class": build.get("failure_class", PLATFORM),
            "detail": build["error"],
        }
        recs = [{**base_record(unit, pi), "failure": fail} for pi in pending]
        append_records(path, recs)
        return recs
    searched = search_bank(unit, hcfg, endpoints, [pi.item.question for pi in pending], k)
    recs: list[dict[str, Any]] = []
    to_read: list[tuple[PlannedItem, dict[str, Any], list[Any]]] = []
    for pi, res in zip(pending, searched, strict=True):
        rec = base_record(unit, pi)
        if isinstance(res, Fault):
            rec["failure"] = {"stage": "search", "class": PLATFORM, "detail": res.detail}
            recs.append(rec)
            continue
        rec["retrieved"] = [e.text for e in res]
        to_read.append((pi, rec, res))
    to_judge: list[tuple[PlannedItem, dict[str, Any], str]] = []
    for (pi, rec, _), (ans, finish) in zip(to_read, read_answers(to_read, readers, unit.label), strict=True):
        if isinstance(ans, Fault):
            rec["failure"] = {"stage": "reader", "class": PLATFORM, "detail": ans.detail}
            recs.append(rec)
            continue
        rec["answer"], rec["finish_reason"] = ans, finish  # "length": cut at the benchmark's budget
        to_judge.append((pi, rec, ans))
    verdicts = score_answers(to_judge, judges, unit.label)
    for (_, rec, _), v in zip(to_judge, verdicts, strict=True):
        if isinstance(v, Fault):
            rec["failure"] = {"stage": "judge", "class": PLATFORM, "detail": v.detail}
        else:
            rec["score"], rec["verdict"] = v.score, v.reason
        recs.append(rec)
    append_records(path, recs)
    return recs


def read_answers(
    to_read: list[tuple[PlannedItem, dict[str, Any], list[Any]]],
    readers: dict[str, ChatClient],
    where: str,
) -> list[tuple[str | Fault, str]]:
    """The fixed reader's (answer, finish_reason) per item, each benchmark under its own answer budget."""
    out: list[tuple[str | Fault, str]] = [("", "")] * len(to_read)
    by_bench: dict[str, list[int]] = {}
    for i, (pi, _, _) in enumerate(to_read):
        by_bench.setdefault(pi.item.benchmark, []).append(i)
    for bench, idx in by_bench.items():
        reqs = [
            ChatRequest(
                to_read[i][0].metric.reader_prompt(to_read[i][0].item, to_read[i][2]),
                parse_answer,
                f"{where} {to_read[i][0].item.item_id}",
            )
            for i in idx
        ]
        for i, r in zip(idx, readers[bench].run_batch_finish(reqs), strict=True):
            out[i] = r
    return out


def score_answers(
    to_judge: list[tuple[PlannedItem, dict[str, Any], str]],
    judges: dict[str, ChatClient],
    where: str,
) -> list[Verdict | Fault]:
    out: list[Verdict | Fault | None] = [None] * len(to_judge)
    by_bench: dict[str, list[int]] = {}
    for i, (pi, _, ans) in enumerate(to_judge):
        m = pi.metric
        if m.local is not None:
            out[i] = m.local(pi.item, ans)
        else:
            by_bench.setdefault(pi.item.benchmark, []).append(i)
    for bench, idx in by_bench.items():
        m = to_judge[idx[0]][0].metric
        reqs = [
            ChatRequest(
                m.judge_messages(to_judge[i][0].item, to_judge[i][2]),
                m.parse,
                f"{where} {to_judge[i][0].item.item_id}",
                m.json_reply,
            )
            for i in idx
        ]
        for i, v in zip(idx, judges[bench].run_batch(reqs), strict=True):
            out[i] = v
    return out  # type: ignore[return-value]


def search_bank(
    unit: Unit, hcfg: HarnessConfig, endpoints: Endpoints, queries: list[str], k: int
) -> list[Any]:
    """The harness's own retrieval on the finished bank (opened read-side, never written)."""
    bank = unit.dir / "bank"
    h = make_harness(
        hcfg,
        endpoints.search,
        endpoints.embedder,
        sandbox_root=unit.dir,
        sandbox_id=f"read-{uuid.uuid4().hex[:8]}",
    )
    try:
        try:
            h.open(bank)
        except Exception as e:
            return [Fault("bank", f"{unit.label}: open {bank}: {e}", 1)] * len(queries)
        out: list[Any] = []
        for q in queries:
            try:
                out.append(list(h.search(q, k)))
            except Exception as e:
                out.append(Fault("bank", f"{unit.label}: search: {e}", 1))
        return out
    finally:
        release_harness(h)


# ------------------------------------------------------------------------------------------ the run
@dataclass
class MatrixRun:
    cfg: MatrixConfig
    out: Path  # <run>/eval
    endpoints: Endpoints
    parallel_builds: int = 1
    progress: bool = True
    # refuse a cache built by another writer under the same name (check_writer); off only where a
    # directory belongs to one writer by construction
    check_writers: bool = True
    stats: Counter = field(default_factory=Counter)
    build_times: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, writers: list[WriterConfig] | None = None) -> list[dict[str, Any]]:
        """Every writer's banks and answers; returns every item record of the matrix (cached ones too)."""
        plans = plan_matrix(self.cfg)
        check_plan(self.out, plan_record(plans, self.cfg))
        readers, judges = {}, {}
        for p in plans:
            for b in p.benchmarks:
                m = metric_for(b)
                budget = self.cfg.protocol.budget(m)
                readers[b] = ChatClient(dataclasses.replace(self.endpoints.reader, max_tokens=budget))
                if m.judge_messages is not None and self.cfg.protocol.judge_mode == "protocol":
                    jc = self.endpoints.judge
                    if not jc.base_url:
                        raise ValueError(
                            f"benchmark {b} is scored by an LLM judge: set protocol.judge.base_url"
                        )
                    if m.judge_max_tokens:
                        jc = dataclasses.replace(jc, max_tokens=m.judge_max_tokens)
                    judges[b] = ChatClient(jc)
        for w in writers or self.cfg.writers:
            if self.check_writers:
                check_writer(self.out, w)
            for p in plans:
                self._run_cell(w, p, readers, judges)
        self.stats["reader_calls"] += sum(r.stats["calls"] for r in readers.values())
        self.stats["reader_cut"] += sum(r.stats["finish/length"] for r in readers.values())
        self.stats["judge_calls"] += sum(j.stats["calls"] for j in judges.values())
        return self.all_records(plans)

    def units(self, w: WriterConfig, p: HarnessPlan) -> list[Unit]:
        return [
            Unit(w, p.harness, seq, self.out / "cache" / safe(w.name) / safe(p.harness) / safe(seq), items)
            for seq, items in sorted(p.items.items())
        ]

    def _run_cell(self, w: WriterConfig, p: HarnessPlan, readers, judges) -> None:
        hcfg = self.cfg.harnesses[p.harness]
        units = self.units(w, p)
        chunks_of = {}
        for c in p.dataset.tables["chunks"]:
            chunks_of.setdefault(c.sequence_id, []).append(c)
        llm = EmptyWriter() if w.kind == "empty" else self.endpoints.writers[w.name]
        if isinstance(llm, Endpoint):
            llm = StaticWriter(llm)
        kills = set(self.cfg.faults.kill_sandbox)

        def build(u: Unit) -> dict[str, Any]:
            chunks = sorted(chunks_of.get(u.sequence_id, []), key=lambda c: c.index)
            if not chunks:
                raise ValueError(f"{p.dataset.root}: sequence {u.sequence_id} has no chunks")
            fresh = not (u.dir / "build.json").exists()
            res = build_bank(
                u,
                chunks,
                hcfg,
                llm,
                self.endpoints.embedder,
                retries=self.cfg.build_retries,
                kill=f"{p.harness}:{u.sequence_id}" in kills,
                counters=self.stats,
            )
            if fresh:  # recorded as it finishes: a killed run keeps the times of what it built
                self.stats["banks_built"] += 1
                t = {
                    "writer": w.name,
                    "harness": p.harness,
                    "sequence": u.sequence_id,
                    "seconds": res["seconds"],
                    "chunks": res.get("chunks", 0),
                    "status": res["status"],
                    "attempts": res["attempts"],
                }
                with self._lock:
                    self.build_times.append(t)
                    append_records(self.out / "build_times.jsonl", [t])
            return res

        desc = f"{w.name} | {p.harness} [{', '.join(p.benchmarks)}]"
        with (
            _bar(len(units), f"build {desc}", self.progress) as bar,
            ThreadPoolExecutor(self.parallel_builds) as ex,
        ):
            builds = []
            for res in ex.map(build, units):
                builds.append(res)
                bar.update(1)
        served = self.endpoints.served.get(w.name)
        before = served() if served else None
        with _bar(len(units), f"answer {desc}", self.progress) as bar:
            for u, b in zip(units, builds, strict=True):
                recs = answer_unit(u, b, hcfg, self.endpoints, self.cfg.protocol.search_k, readers, judges)
                self.stats["items_scored"] += len(recs)
                bar.update(1)
        if served and served() != before:
            raise WriterLeakError(
                f"writer {w.name} served {served() - before} call(s) while {p.harness}'s banks were searched, "
                "read and judged: only the write path may reach the writer (check the harness's search-time "
                "LLM and protocol.reader / protocol.judge)"
            )

    def all_records(self, plans: list[HarnessPlan]) -> list[dict[str, Any]]:
        recs = []
        for w in self.cfg.writers:
            for p in plans:
                for u in self.units(w, p):
                    done = read_done(u.dir / "items.jsonl")
                    recs += [done[pi.item.item_id] for pi in u.items if pi.item.item_id in done]
        return recs


def held_out(hcfg: HarnessConfig) -> bool:
    return get_spec(hcfg.framework, hcfg.scene).held_out


@contextlib.contextmanager
def _bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, disable=not enabled, leave=True, dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()
