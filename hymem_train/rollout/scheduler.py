"""Window scheduler: sequences advance window by window across steps.

The scheduler's unit is a lineage: a (harness configuration, sequence) pair whose bank belongs to one
framework. Two ways to get them (docs/stages.md, "Data per harness"):
- `data.per_harness` (windows per harness): every harness configuration trains on every sequence of its
  own dataset. The same sequence id in Chat, Mem0 and MemOS is three independent lineages; its lineage
  id (the cursor key, the bank lineage key, part of the trajectory ids) is "<harness>:<sequence>".
- `data.path`, the single-dataset shorthand (one window list): each sequence is bound to one harness
  round-robin; its lineage id is the sequence id (as in runs made before per-harness data, so they resume unchanged).

The units are the schedule manifest, written to the run directory and reconciled with the declared
harness set at start-up (silent failure harness-unscheduled: a declared configuration with no data, or data for an
undeclared one, would silently drop out of mixed-harness training or never be trained on). A step takes
at most one window per lineage, because window k+1 needs window k's promoted bank; units are interleaved
across harnesses so each step holds the harness mix. The cursor is persisted after every step, so a
resumed run continues with the window it had not finished, losing none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_pipeline.store import atomic_write_text
from reward.schedule import ScheduleError, reconcile_data, reconcile_schedule


@dataclass
class ScheduledWindow:
    window: Any  # data_pipeline.schema.Window
    harness: str  # harness config name of its lineage
    epoch: int  # how many times this lineage has been restarted from an empty bank
    per_harness: bool = False  # scheduled from data.per_harness: the lineage id names the harness

    @property
    def lineage_id(self) -> str:
        """The scheduler's unit and the bank lineage's key: "<harness>:<sequence>" under data.per_harness
        (a sequence may run in several harnesses), the sequence id under the data.path shorthand."""
        seq = self.window.sequence_id
        return f"{self.harness}:{seq}" if self.per_harness else seq


def _by_sequence(windows: list[Any], where: str) -> dict[str, list[Any]]:
    by_seq: dict[str, list[Any]] = {}
    for w in sorted(windows, key=lambda w: (w.sequence_id, w.index)):
        by_seq.setdefault(w.sequence_id, []).append(w)
    for seq, ws in by_seq.items():
        if [w.index for w in ws] != list(range(len(ws))):
            raise ValueError(f"{where}: sequence {seq} has windows {[w.index for w in ws]}, want 0..n-1")
    return by_seq


class WindowScheduler:
    def __init__(
        self,
        windows: list[Any] | Mapping[str, list[Any]],
        harnesses: list[str],
        run_dir: str | Path,
        *,
        growth_bounds: dict[str, Any] | None = None,
    ):
        """`windows`: harness name -> its dataset's windows (data.per_harness), or one window list whose
        sequences are bound to the harnesses round-robin (the data.path shorthand)."""
        self.root = Path(run_dir)
        self.manifest_path = self.root / "schedule_manifest.json"
        self.state_path = self.root / "scheduler.json"
        on_disk = json.loads(self.manifest_path.read_text()) if self.manifest_path.exists() else None
        self.per_harness = isinstance(windows, Mapping)
        if self.per_harness:
            reconcile_data(windows, harnesses, where="data.per_harness")
            units = self._per_harness_units(windows, harnesses, on_disk)
        else:
            units = self._round_robin_units(windows, harnesses, on_disk)
        self.units: list[tuple[str, str]] = units  # (harness, sequence), in scheduling order
        self.weights = reconcile_schedule(
            [h for h, _ in units], harnesses, growth_bounds=growth_bounds, where=str(self.manifest_path)
        )
        self.keys = [self._key(h, s) for h, s in units]
        self.cursor = {k: 0 for k in self.keys}  # next window index per lineage
        self.epoch = {k: 0 for k in self.keys}
        self.rr = 0  # round-robin pointer over units
        if self.state_path.exists():
            self._set_state(json.loads(self.state_path.read_text()), str(self.state_path))
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.manifest_path, json.dumps(self.manifest, indent=1, sort_keys=True))

    def _key(self, harness: str, seq: str) -> str:
        return f"{harness}:{seq}" if self.per_harness else seq

    def _round_robin_units(
        self, windows: list[Any], harnesses: list[str], on_disk: Any
    ) -> list[tuple[str, str]]:
        if not windows:
            raise ValueError("window scheduler: the dataset has no windows")
        self.by_unit = {("", s): ws for s, ws in _by_sequence(windows, "window scheduler").items()}
        sequences = sorted(s for _, s in self.by_unit)
        if isinstance(on_disk, dict) and "per_harness" in on_disk:
            raise ScheduleError(
                f"{self.manifest_path}: written by a run with data.per_harness (every harness trains on every "
                "sequence); this run has the data.path shorthand: resume it with the same data.per_harness"
            )
        if on_disk is not None:
            self.manifest: dict[str, Any] = on_disk
        else:  # round-robin binding over sorted sequences: deterministic, every harness gets sequences
            self.manifest = {s: harnesses[i % len(harnesses)] for i, s in enumerate(sequences)}
        if set(self.manifest) != set(sequences):
            raise ValueError(f"{self.manifest_path}: manifest sequences differ from the dataset's")
        self.by_unit = {(self.manifest[s], s): ws for (_, s), ws in self.by_unit.items()}
        return [(self.manifest[s], s) for s in sequences]

    def _per_harness_units(
        self, windows: Mapping[str, list[Any]], harnesses: list[str], on_disk: Any
    ) -> list[tuple[str, str]]:
        self.by_unit = {}
        seqs: dict[str, list[str]] = {}
        for h in harnesses:  # declared order
            by_seq = _by_sequence(windows[h], f"window scheduler ({h})")
            seqs[h] = sorted(by_seq)
            self.by_unit.update({(h, s): ws for s, ws in by_seq.items()})
        self.manifest = {"per_harness": seqs}
        if on_disk is not None and on_disk != self.manifest:
            if "per_harness" not in on_disk:
                raise ScheduleError(
                    f"{self.manifest_path}: written by a run with the data.path shorthand (one harness per "
                    "sequence); this run has data.per_harness: resume it with data.path, or use a new run.output_dir"
                )
            old = {(h, s) for h, ss in on_disk["per_harness"].items() for s in ss}
            new = set(self.by_unit)
            raise ScheduleError(
                f"{self.manifest_path}: the data changed since the run started: units gone "
                f"{sorted(old - new)[:5]}, units new {sorted(new - old)[:5]}; use the run's data or a new run.output_dir"
            )
        # interleaved across harnesses, so a step's windows hold the harness mix
        return [
            (h, seqs[h][k])
            for k in range(max(map(len, seqs.values()), default=0))
            for h in harnesses
            if k < len(seqs[h])
        ]

    def state(self) -> dict:
        """The cursor, saved inside each training checkpoint: a resumed run restores the cursor of the
        checkpoint it loads, not the newer one a killed step may have written to scheduler.json."""
        return {"cursor": dict(self.cursor), "epoch": dict(self.epoch), "rr": self.rr}

    def restore(self, st: dict) -> None:
        self._set_state(st, "checkpoint scheduler state")
        atomic_write_text(self.state_path, json.dumps(self.state()))

    def start_over(self) -> None:
        """Every lineage at its first window: a run with no complete checkpoint starts there, whatever a
        first step killed before its checkpoint left in scheduler.json (it would skip that step's windows)."""
        self.restore({"cursor": dict.fromkeys(self.keys, 0), "epoch": dict.fromkeys(self.keys, 0), "rr": 0})

    def _set_state(self, st: dict, where: str) -> None:
        if set(st["cursor"]) != set(self.keys) or set(st["epoch"]) != set(self.keys):
            diff = sorted(set(st["cursor"]) ^ set(self.keys))[:5]
            raise ScheduleError(
                f"{where}: its lineages differ from this run's schedule (e.g. {diff}): it belongs to another "
                "data configuration (data.path vs data.per_harness, or other datasets)"
            )
        self.cursor, self.epoch, self.rr = dict(st["cursor"]), dict(st["epoch"]), int(st["rr"])

    def next_windows(self, num_windows: int) -> list[ScheduledWindow]:
        """Up to `num_windows` windows of distinct lineages, round-robin."""
        out = []
        n = len(self.units)
        for k in range(min(num_windows, n)):
            h, seq = self.units[(self.rr + k) % n]
            key = self._key(h, seq)
            out.append(
                ScheduledWindow(
                    self.by_unit[(h, seq)][self.cursor[key]], h, self.epoch[key], self.per_harness
                )
            )
        return out

    def advance(self, done: list[ScheduledWindow]) -> list[str]:
        """Mark windows finished; returns the sequences whose lineage wrapped around (it restarts empty),
        one entry per lineage."""
        wrapped = []
        for sw in done:
            key = sw.lineage_id
            self.cursor[key] += 1
            if self.cursor[key] >= len(self.by_unit[(sw.harness, sw.window.sequence_id)]):
                self.cursor[key] = 0
                self.epoch[key] += 1
                wrapped.append(sw.window.sequence_id)
        self.rr = (self.rr + len(done)) % len(self.units)
        atomic_write_text(self.state_path, json.dumps(self.state()))
        return wrapped
