"""Bank-size log: one line per training rollout in `<run>/bank_sizes.jsonl`, the input of
`python -m reward.calibrate_growth` (the growth penalty's l_h, u_h and floor per harness; the report
does not publish its values: docs/reward.md). A resumed step appends its lines again; the reader
keeps the last line per trajectory."""

from __future__ import annotations

import json
from pathlib import Path

from hymem_train.callbacks import Callback
from reward.bank_sizes import BANK_SIZES_FILE


class BankSizeLog(Callback):
    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / BANK_SIZES_FILE

    def on_rollouts(self, step: int, groups: list) -> None:
        lines = []
        for g in groups:
            w = g.window
            for r in g.results:
                rec = r.record
                lines.append(
                    json.dumps(
                        {
                            "step": step,
                            "trajectory_id": rec.trajectory_id,
                            "harness": g.harness,
                            "sequence_id": w.sequence_id,
                            "window_index": w.index,
                            "status": rec.status,
                            "parent_size_tokens": g.parent_size,
                            "size_tokens": [c.size_tokens for c in rec.chunks],
                            "chunk_status": [c.status for c in rec.chunks],
                        }
                    )
                    + "\n"
                )
        with self.path.open("a") as f:
            f.write("".join(lines))
