"""Where the gateway puts the Segments it records: in memory per trajectory, optionally mirrored
to a JSONL file in the run directory (rollout dumps for train-only replay)."""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path

from hymem_train.segments import Segment


class SegmentStore:
    def __init__(self, jsonl_path: str | Path | None = None) -> None:
        self._by_traj: dict[str, list[Segment]] = defaultdict(list)
        self._lock = threading.Lock()
        self._path = Path(jsonl_path) if jsonl_path else None
        if self._path:
            self._path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, seg: Segment) -> None:
        with self._lock:
            self._by_traj[seg.trajectory_id].append(seg)
            if self._path:
                with self._path.open("a") as f:
                    f.write(seg.to_json() + "\n")

    def get(self, trajectory_id: str) -> list[Segment]:
        with self._lock:
            return list(self._by_traj.get(trajectory_id, []))

    def drain(self, trajectory_id: str) -> list[Segment]:
        with self._lock:
            return self._by_traj.pop(trajectory_id, [])

    def all(self) -> list[Segment]:
        with self._lock:
            return [s for segs in self._by_traj.values() for s in segs]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._by_traj.values())
