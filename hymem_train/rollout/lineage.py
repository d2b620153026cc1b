"""Bank lineage across windows.

After a window is scored, the final bank of the rollout with the highest sum of chunk scores
becomes the parent of that sequence's next window. The promoted bank is copied into the run
directory, closed, reopened from disk and checked against a known record (the first entry the
promotion read, and the entry count) before the lineage file points at it; the same check runs
again before the next window uses it. A bank that did not persist fails the run instead of
silently starting the next window from an empty or stale bank.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from data_pipeline.store import atomic_write_text

log = logging.getLogger(__name__)


class BankPersistenceError(RuntimeError):
    """A promoted bank that, reopened from disk, does not hold what was promoted (silent failure bank-not-carried)."""


@dataclass
class PromotedBank:
    # the lineage id (rollout/scheduler.py: ScheduledWindow.lineage_id): the sequence id, prefixed by its
    # harness ("mem0:locomo/conv-26") when sequences are scheduled per harness (data.per_harness)
    sequence_id: str
    epoch: int  # pass over the sequence (a new epoch restarts from an empty bank)
    window_index: int  # the window whose best rollout produced this bank
    bank_dir: str  # inside the run directory
    num_entries: int  # count() at promotion
    known_id: str  # id of one entry present at promotion ("" for an empty bank)
    known_text: str  # its text
    source_trajectory: str  # trajectory id of the promoted rollout
    harness: str  # harness config name the bank belongs to
    size_tokens: int = 0  # bank size in tokens (the next window's growth-penalty baseline)


class BankLineage:
    """Promoted banks per (lineage, epoch, window) in `<run_dir>/lineage.json` (atomic writes). The
    `sequence_id` arguments are lineage ids: under data.per_harness they name the harness, so the same
    sequence in Chat, Mem0 and MemOS is three lineages with three bank chains.

    Keyed by window, not "latest": a run killed after promoting window k but before its scheduler
    advanced redoes window k from window k-1's bank, exactly as the uninterrupted run did.
    """

    def __init__(self, run_dir: str | Path, open_harness: Callable[[str], Any]):
        """`open_harness(harness_name)` returns a harness (no LLM needed) able to open/fork banks."""
        self.root = Path(run_dir)
        self.path = self.root / "lineage.json"
        self.open_harness = open_harness
        self.banks: dict[str, PromotedBank] = {}
        if self.path.exists():
            self.banks = {k: PromotedBank(**v) for k, v in json.loads(self.path.read_text()).items()}

    @staticmethod
    def key(sequence_id: str, epoch: int, window_index: int) -> str:
        return f"{sequence_id}@e{epoch}/w{window_index}"

    def parent(self, sequence_id: str, epoch: int, window_index: int) -> str | None:
        """The verified closed parent bank of a window: window k-1's promoted bank; None for window 0."""
        if window_index == 0:
            return None
        b = self.banks.get(self.key(sequence_id, epoch, window_index - 1))
        if b is None:
            raise BankPersistenceError(
                f"{sequence_id} epoch {epoch}: no promoted bank for window {window_index - 1}, needed by window "
                f"{window_index} (silent failure bank-not-carried)"
            )
        self.verify(b)
        return b.bank_dir

    def promote(
        self,
        sequence_id: str,
        epoch: int,
        window_index: int,
        final_bank_dir: str,
        trajectory: str,
        harness: str,
        size_tokens: int = 0,
    ) -> PromotedBank:
        # "<harness>:<sequence>" -> banks/<harness>/<sequence>/...
        where = sequence_id.replace("/", "_").replace(":", "/", 1)
        dst = self.root / "banks" / where / f"e{epoch}" / f"w{window_index:04d}"
        if dst.exists():  # a resumed run re-promotes the same window: replace it whole
            shutil.rmtree(dst)
        h = self.open_harness(harness)
        try:
            h.fork(final_bank_dir, [dst])
            h.open(dst)
            try:
                entries = h.read_all()
                n = h.count()
            finally:
                h.close()
        finally:
            getattr(h, "shutdown", lambda: None)()
        first = entries[0] if entries else None
        b = PromotedBank(
            sequence_id,
            epoch,
            window_index,
            str(dst),
            n,
            first.id if first else "",
            first.text if first else "",
            trajectory,
            harness,
            size_tokens,
        )
        self.verify(b)  # reopen from disk before anyone relies on it
        self.banks[self.key(sequence_id, epoch, window_index)] = b
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, json.dumps({k: asdict(v) for k, v in self.banks.items()}, indent=1))
        log.info("promoted %s window %d: %d entries -> %s", sequence_id, window_index, n, dst)
        return b

    def parent_size_tokens(self, sequence_id: str, epoch: int, window_index: int) -> int:
        if window_index == 0:
            return 0
        b = self.banks.get(self.key(sequence_id, epoch, window_index - 1))
        return b.size_tokens if b is not None else 0

    def verify(self, b: PromotedBank) -> None:
        if not Path(b.bank_dir).exists():
            raise BankPersistenceError(
                f"{b.sequence_id}: promoted bank {b.bank_dir} is missing (silent failure bank-not-carried)"
            )
        h = self.open_harness(b.harness)
        try:
            h.open(b.bank_dir)
            try:
                n = h.count()
                texts = {e.id: e.text for e in h.read_all()} if b.known_id else {}
            finally:
                h.close()
        finally:
            getattr(h, "shutdown", lambda: None)()
        if n != b.num_entries or (b.known_id and texts.get(b.known_id) != b.known_text):
            raise BankPersistenceError(
                f"{b.sequence_id}: bank {b.bank_dir} reopened with {n} entries (promoted {b.num_entries}); known record "
                f"{b.known_id!r} {'missing or changed' if b.known_id else ''} (silent failure bank-not-carried)"
            )
