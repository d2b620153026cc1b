"""Window scheduler: sequences advance window by window across steps (DESIGN.md section 1).

Each sequence is bound to one harness configuration (a bank belongs to one framework); the binding
is the schedule manifest, written to the run directory and reconciled with the declared harness set
at start-up (silent failure 4: a declared configuration that never appears in the schedule would
silently drop out of mixed-harness training). A step takes at most one window per sequence, because
window k+1 needs window k's promoted bank. The cursor is persisted after every step, so a resumed run
continues with the window it had not finished, losing none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_pipeline.store import atomic_write_text
from reward.schedule import reconcile_schedule


@dataclass
class ScheduledWindow:
    window: Any  # data_pipeline.schema.Window
    harness: str  # harness config name its sequence is bound to
    epoch: int  # how many times this sequence has been restarted from an empty bank


class WindowScheduler:
    def __init__(
        self,
        windows: list[Any],
        harnesses: list[str],
        run_dir: str | Path,
        *,
        growth_bounds: dict[str, Any] | None = None,
    ):
        if not windows:
            raise ValueError("window scheduler: the dataset has no windows")
        self.by_seq: dict[str, list[Any]] = {}
        for w in sorted(windows, key=lambda w: (w.sequence_id, w.index)):
            self.by_seq.setdefault(w.sequence_id, []).append(w)
        for seq, ws in self.by_seq.items():
            if [w.index for w in ws] != list(range(len(ws))):
                raise ValueError(
                    f"window scheduler: sequence {seq} has windows {[w.index for w in ws]}, want 0..n-1"
                )
        self.sequences = sorted(self.by_seq)
        self.root = Path(run_dir)
        self.manifest_path = self.root / "schedule_manifest.json"
        self.state_path = self.root / "scheduler.json"
        if self.manifest_path.exists():
            self.manifest: dict[str, str] = json.loads(self.manifest_path.read_text())
        else:  # round-robin binding over sorted sequences: deterministic, every harness gets sequences
            self.manifest = {s: harnesses[i % len(harnesses)] for i, s in enumerate(self.sequences)}
        if set(self.manifest) != set(self.sequences):
            raise ValueError(f"{self.manifest_path}: manifest sequences differ from the dataset's")
        self.weights = reconcile_schedule(
            list(self.manifest.values()),
            harnesses,
            growth_bounds=growth_bounds,
            where=str(self.manifest_path),
        )
        self.cursor = {s: 0 for s in self.sequences}  # next window index per sequence
        self.epoch = {s: 0 for s in self.sequences}
        self.rr = 0  # round-robin pointer over sequences
        if self.state_path.exists():
            st = json.loads(self.state_path.read_text())
            self.cursor, self.epoch, self.rr = st["cursor"], st["epoch"], st["rr"]
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.manifest_path, json.dumps(self.manifest, indent=1, sort_keys=True))

    def state(self) -> dict:
        """The cursor, saved inside each training checkpoint: a resumed run restores the cursor of the
        checkpoint it loads, not the newer one a killed step may have written to scheduler.json."""
        return {"cursor": dict(self.cursor), "epoch": dict(self.epoch), "rr": self.rr}

    def restore(self, st: dict) -> None:
        self.cursor, self.epoch, self.rr = dict(st["cursor"]), dict(st["epoch"]), int(st["rr"])
        atomic_write_text(self.state_path, json.dumps(self.state()))

    def next_windows(self, num_windows: int) -> list[ScheduledWindow]:
        """Up to `num_windows` windows of distinct sequences, round-robin."""
        out = []
        n = len(self.sequences)
        for k in range(min(num_windows, n)):
            seq = self.sequences[(self.rr + k) % n]
            out.append(
                ScheduledWindow(self.by_seq[seq][self.cursor[seq]], self.manifest[seq], self.epoch[seq])
            )
        return out

    def advance(self, done: list[ScheduledWindow]) -> list[str]:
        """Mark windows finished; returns sequences that wrapped around (their lineage restarts empty)."""
        wrapped = []
        for sw in done:
            seq = sw.window.sequence_id
            self.cursor[seq] += 1
            if self.cursor[seq] >= len(self.by_seq[seq]):
                self.cursor[seq] = 0
                self.epoch[seq] += 1
                wrapped.append(seq)
        self.rr = (self.rr + len(done)) % len(self.sequences)
        atomic_write_text(self.state_path, json.dumps(self.state()))
        return wrapped
