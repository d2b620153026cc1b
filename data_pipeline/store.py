"""Built datasets on disk: one directory of HF `datasets` tables + `manifest.json`.

Layout of a built dataset directory:

    <dir>/manifest.json          Manifest: schema version, sources, answers_atomic, counts, eval subsample
    <dir>/<table>/               `Dataset.save_to_disk` of each table, with FEATURES[table]
    <dir>/stats.json, stats.md   the report's statistics table (written by stats.py)

Nothing half-written: everything is written into a sibling temp directory that is
renamed over the target only when complete, `manifest.json` last; a crash leaves the previous version
(or nothing). A build of several profiles (data_pipeline/build.py) stages them all first, then holds
`<out_dir>/BUILD_INCOMPLETE` while it renames them into place and writes `<out_dir>/build.json` last:
`read_manifest` (so `read_table` and `BuiltDataset`) refuses a profile while that marker exists or
when its manifest's `config.build_id` is not the one `build.json` names (mixed versions).

Permissions: directories 0755 and files 0644, less the process umask (as `mkdir` / `open` do), so
other users of a shared cluster can read a built dataset; `mkdtemp` / `mkstemp` alone give 0700 / 0600.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from datasets import Dataset, Features, List, Value, load_from_disk

from data_pipeline.schema import RECORD_TYPES, SCHEMA_VERSION, Manifest, Record, RecordError

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
BUILD_INCOMPLETE = "BUILD_INCOMPLETE"  # <out_dir>/ marker: a build is renaming profiles into place
BUILD_MANIFEST = "build.json"  # <out_dir>/ top-level manifest, written last: build id + its profiles

# ---------------------------------------------------------------------------------------------------
# explicit HF Features of the stored tables, one per data_pipeline.schema.RECORD_TYPES table (a change to
# a stored field bumps schema.SCHEMA_VERSION)

_TURN = {
    "turn_id": Value("string"),
    "speaker": Value("string"),
    "text": Value("string"),
    "image_caption": Value("string"),
    "has_answer": Value("bool"),
}
_STR_LIST = List(Value("string"))
_INT_LIST = List(Value("int32"))

FEATURES: dict[str, Features] = {
    "sequences": Features(
        {
            "sequence_id": Value("string"),
            "source": Value("string"),
            "sessions": List(
                {"session_id": Value("string"), "date": Value("string"), "turns": List(dict(_TURN))}
            ),
            "speakers": _STR_LIST,
        }
    ),
    "chunks": Features(
        {
            "sequence_id": Value("string"),
            "index": Value("int32"),
            "turns": List(dict(_TURN)),
            "date": Value("string"),
            "session_ids": _STR_LIST,
            "num_tokens": Value("int32"),
            "session_starts": _INT_LIST,
            "session_dates": _STR_LIST,
        }
    ),
    "windows": Features(
        {"sequence_id": Value("string"), "index": Value("int32"), "chunk_indices": _INT_LIST}
    ),
    "facts": Features(
        {
            "fact_id": Value("string"),
            "sequence_id": Value("string"),
            "chunk_index": Value("int32"),
            "text": Value("string"),
            "turn_ids": _STR_LIST,
            "supersedes": Value("string"),
        }
    ),
    "probes": Features(
        {
            "probe_id": Value("string"),
            "sequence_id": Value("string"),
            "chunk_index": Value("int32"),
            "kind": Value("string"),
            "question": Value("string"),
            "reference": Value("string"),
            "rubric": Value("string"),
            "is_trap": Value("bool"),
            "fact_ids": _STR_LIST,
        }
    ),
    "orm_questions": Features(
        {
            "question_id": Value("string"),
            "sequence_id": Value("string"),
            "window_index": Value("int32"),
            "question": Value("string"),
            "answer": Value("string"),
            "evidence_chunks": _INT_LIST,
            "gold_facts": List(
                {
                    "fact": Value("string"),
                    "source_chunk": Value("int32"),
                    "fact_id": Value("string"),
                    "answer": Value("string"),
                }
            ),
            "rubric": Value("string"),
        }
    ),
    "eval_items": Features(
        {
            "item_id": Value("string"),
            "benchmark": Value("string"),
            "sequence_id": Value("string"),
            "question": Value("string"),
            "answer": Value("string"),
            "category": Value("string"),
            "evidence_turn_ids": _STR_LIST,
            "evidence_session_ids": _STR_LIST,
            "evidence_chunks": _INT_LIST,
            "is_trap": Value("bool"),
            "adversarial_answer": Value("string"),
            "question_date": Value("string"),
            "evidence_issues": _STR_LIST,
        }
    ),
}


def _umask() -> int:
    """The process umask, without changing it (Linux: /proc; elsewhere a set-and-restore)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def shared_mode(path: str | Path, directory: bool) -> None:
    """chmod to what `mkdir` / `open` would give (0755 / 0644 less the umask), not mkdtemp's 0700."""
    os.chmod(path, (0o755 if directory else 0o644) & ~_umask())


def atomic_dir(target: str | Path, fill: Callable[[Path], None]) -> Path:
    """Run `fill(tmp_dir)` then rename tmp_dir onto `target` (replacing an older version)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        shared_mode(tmp, directory=True)
        fill(tmp)
        replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def replace_dir(src: str | Path, target: str | Path) -> None:
    """Rename the complete directory `src` onto `target`, replacing (then deleting) an older version."""
    src, target = Path(src), Path(target)
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(src, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        shared_mode(tmp, directory=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _table_dataset(table: str, records: Iterable[Record]) -> Dataset:
    cls = RECORD_TYPES[table]
    rows = []
    for r in records:
        if not isinstance(r, cls):
            raise TypeError(f"table {table}: got {type(r).__name__}, want {cls.__name__}")
        rows.append(r.to_dict())
    if not rows:
        return Dataset.from_dict({k: [] for k in FEATURES[table]}, features=FEATURES[table])
    return Dataset.from_list(rows, features=FEATURES[table])


def write_dataset(
    target: str | Path,
    tables: dict[str, list[Any]],
    manifest: Manifest,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Write `tables` (name -> records) + manifest (+ extra text files) atomically to `target`."""
    unknown = sorted(set(tables) - set(RECORD_TYPES))
    if unknown:
        raise ValueError(f"write_dataset {target}: unknown table(s) {unknown}")
    manifest.counts = {name: len(rows) for name, rows in tables.items()}
    manifest.schema_version = SCHEMA_VERSION

    def fill(tmp: Path) -> None:
        for name, rows in tables.items():
            ds = _table_dataset(name, rows)
            # num_shards=1: an empty table saved with 0 shards cannot be loaded back (datasets 5.2)
            ds.save_to_disk(str(tmp / name), num_shards=1 if len(ds) == 0 else None)
        for rel, text in (extra_files or {}).items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        # last: a directory with a manifest is complete
        (tmp / MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True))

    out = atomic_dir(target, fill)
    log.info("wrote dataset %s: %s", out, manifest.counts)
    return out


def read_manifest(root: str | Path) -> Manifest:
    path = Path(root) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path}: no manifest (not a built dataset directory)")
    m = Manifest.from_dict(json.loads(path.read_text()), where=str(path))
    if m.schema_version != SCHEMA_VERSION:
        raise RecordError(f"{path}: schema_version {m.schema_version}, this code reads {SCHEMA_VERSION}")
    check_build_complete(root, m)
    return m


def check_build_complete(root: str | Path, manifest: Manifest) -> None:
    """Refuse a profile directory whose build did not finish or that mixes two builds (see top)."""
    root = Path(root)
    out_dir = root.resolve().parent
    marker = out_dir / BUILD_INCOMPLETE
    if marker.exists():
        raise RecordError(
            f"{root}: the data build of {out_dir} did not finish ({marker} exists: {marker.read_text().strip()}); "
            "its profiles may mix two builds: rerun the build (or wait for the running one)"
        )
    top = out_dir / BUILD_MANIFEST
    build_id = manifest.config.get("build_id")
    if top.exists() and build_id is not None:
        built = json.loads(top.read_text())
        want = built.get("profiles", {}).get(root.resolve().name)
        if want is not None and want != build_id:
            raise RecordError(
                f"{root}: built by build {build_id}, but {top} names build {want} for it: "
                "the output mixes two builds; rerun the build"
            )


def read_table(root: str | Path, table: str) -> list[Any]:
    """Read one stored table back as records (strictly validated, each error names table and row)."""
    read_manifest(root)
    path = Path(root) / table
    if not path.exists():
        return []
    ds = load_from_disk(str(path))
    cls = RECORD_TYPES[table]
    id_field = next(iter(FEATURES[table]))
    return [cls.from_dict(row, where=f"{path}[{i}] ({row.get(id_field)})") for i, row in enumerate(ds)]


LEAKAGE_FILE = "leakage.json"  # reward.leakage: the items a frozen reader answers from an empty bank


def leaked_ids(root: str | Path) -> set[str]:
    """Probe and ORM question ids `reward.leakage` found answerable from an empty bank (none checked: {})."""
    p = Path(root) / LEAKAGE_FILE
    if not p.exists():
        return set()
    d = json.loads(p.read_text())
    return set(d["leaked_probes"]) | set(d["leaked_questions"])


class BuiltDataset:
    """All tables of a built dataset directory, indexed the way the rollout and reward code read them.
    The probes and ORM questions its leakage.json lists are dropped unless `keep_leaked`."""

    def __init__(self, root: str | Path, *, keep_leaked: bool = False):
        self.root = Path(root)
        self.manifest = read_manifest(self.root)
        self.tables: dict[str, list[Any]] = {t: read_table(self.root, t) for t in RECORD_TYPES}
        self.dropped = set() if keep_leaked else leaked_ids(self.root)
        if self.dropped:
            self.tables["probes"] = [p for p in self.tables["probes"] if p.probe_id not in self.dropped]
            qs = self.tables["orm_questions"]
            self.tables["orm_questions"] = [q for q in qs if q.question_id not in self.dropped]
            log.info(
                "%s: %d leaked probes / ORM questions dropped (%s)",
                self.root,
                len(self.dropped),
                LEAKAGE_FILE,
            )
        self._chunks = {(c.sequence_id, c.index): c for c in self.tables["chunks"]}
        self._probes: dict[tuple[str, int], list[Any]] = {}
        for p in self.tables["probes"]:
            self._probes.setdefault((p.sequence_id, p.chunk_index), []).append(p)
        self._questions: dict[tuple[str, int], list[Any]] = {}
        for q in self.tables["orm_questions"]:
            self._questions.setdefault((q.sequence_id, q.window_index), []).append(q)

    @property
    def windows(self) -> list[Any]:
        return self.tables["windows"]

    def chunks_of(self, window: Any) -> list[Any]:
        return [self._chunks[(window.sequence_id, i)] for i in window.chunk_indices]

    def probes_of(self, window: Any) -> list[Any]:
        """PRM probes and traps of the window's chunks, in chunk order."""
        return [p for i in window.chunk_indices for p in self._probes.get((window.sequence_id, i), [])]

    def questions_of(self, window: Any) -> list[Any]:
        """ORM questions asked after the window."""
        return list(self._questions.get((window.sequence_id, window.index), []))

    def of(self, harness: str) -> BuiltDataset:
        """The dataset a harness configuration trains on: one dataset serves every harness."""
        return self


class HarnessDatasets:
    """The training data of a stage: harness config name -> its BuiltDataset. From `data.per_harness`
    every harness trains on every sequence of its own dataset (the same sequence in several harnesses is
    several lineages); from the `data.path` shorthand (`round_robin`) one dataset serves every harness
    and each sequence is bound to one harness. A directory named by several harnesses is read once."""

    def __init__(
        self, per_harness: dict[str, str | Path], *, round_robin: bool = False, keep_leaked: bool = False
    ):
        if not per_harness:
            raise ValueError("HarnessDatasets: no harness has a dataset")
        by_dir: dict[str, BuiltDataset] = {}
        self.by_harness: dict[str, BuiltDataset] = {}
        for name, root in per_harness.items():
            key = str(Path(root).resolve())
            if key not in by_dir:
                by_dir[key] = BuiltDataset(root, keep_leaked=keep_leaked)
            self.by_harness[name] = by_dir[key]
        if round_robin and len(by_dir) != 1:
            raise ValueError("HarnessDatasets: round_robin binds sequences of one dataset, got several")
        self.round_robin = round_robin

    @classmethod
    def from_config(
        cls, path: str, per_harness: dict[str, str], harnesses: list[str], *, keep_leaked: bool = False
    ) -> HarnessDatasets:
        """`data.per_harness`, or the `data.path` shorthand (one directory, sequences round-robin)."""
        if per_harness:
            return cls(dict(per_harness), keep_leaked=keep_leaked)
        return cls({h: path for h in harnesses}, round_robin=True, keep_leaked=keep_leaked)

    def of(self, harness: str) -> BuiltDataset:
        if harness not in self.by_harness:
            raise KeyError(
                f"no dataset for harness {harness!r}, have {sorted(self.by_harness)} (silent failure harness-unscheduled)"
            )
        return self.by_harness[harness]

    def schedule(self) -> list[Any] | dict[str, list[Any]]:
        """What the window scheduler takes: one window list (round-robin binding) or windows per harness."""
        if self.round_robin:
            return next(iter(self.by_harness.values())).windows
        return {h: d.windows for h, d in self.by_harness.items()}

    @property
    def manifests(self) -> dict[str, Manifest]:
        return {h: d.manifest for h, d in self.by_harness.items()}
