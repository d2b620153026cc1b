"""The bank-size record of a run: `<run>/bank_sizes.jsonl`, one line per training rollout (the parent
bank's and each chunk's bank size in tokens, chunk statuses, harness), written by the stages'
bank-size log (hymem_train/callbacks/bank_sizes.py) and read by `python -m reward.calibrate_growth`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

BANK_SIZES_FILE = "bank_sizes.jsonl"  # written into every OPD / RL run directory


def load_rows(run_dirs: list[Path]) -> list[dict]:
    """Every recorded training rollout of the given runs, the last line per trajectory (a resumed step
    records its rollouts again). A truncated final line (a run killed mid-write) is skipped with a
    warning; a bad line anywhere else is an error."""
    rows: list[dict] = []
    for d in run_dirs:
        p = Path(d) / BANK_SIZES_FILE
        if not p.exists():
            raise FileNotFoundError(
                f"{p}: no bank sizes recorded; every OPD/RL step writes this file (run OPD with this version)"
            )
        lines = p.read_text().splitlines()
        by_tid: dict[str, dict] = {}
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    log.warning("%s: skipping a truncated last line (a killed run)", p)
                    continue
                raise ValueError(f"{p}:{i + 1}: not a JSON line") from None
            missing = {"trajectory_id", "harness", "parent_size_tokens", "size_tokens", "chunk_status"} - set(
                row
            )
            if missing:
                raise ValueError(f"{p}:{i + 1}: missing {sorted(missing)}")
            by_tid[row["trajectory_id"]] = row
        rows += by_tid.values()
    return rows
