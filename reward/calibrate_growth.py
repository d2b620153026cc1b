"""Calibrate the growth penalty's per-harness bounds (l_h, u_h, floor) from the bank sizes of OPD rollouts.

    python -m reward.calibrate_growth runs/hy_memory_opd                     # table + Hydra overrides
    python -m reward.calibrate_growth runs/opd_a runs/opd_b --out growth.yaml  # several runs, YAML file

The report defines pen[t] from the growth ratio g_t = B_t / B_{t-1} and per-harness bounds l_h, u_h
but does not publish them (docs/reward.md). The frameworks store very differently (Mem0 a sentence per
fact, MemOS pages, the native harness terse lines), so bounds from one do not transfer: we derive them
from what the distilled policy does in each harness before RL starts, i.e. from OPD rollouts. Every
OPD and RL step appends one line per training rollout to `<run>/bank_sizes.jsonl`
(`hymem_train/callbacks/bank_sizes.py`); this module reads those lines.

Our choices (the report is silent on each; change them with the flags):
- **floor_tokens** = the median size of a first write into an empty bank (parent 0 tokens, chunk
  status ok, bank not empty after it). g_t = B_t / max(B_{t-1}, floor): a typical first write then has
  g ~ 1 instead of an infinite ratio, and a bank smaller than one typical write is measured against
  that write.
- **l_h** = the 90th percentile of g over valid writes (chunk status ok), never below 1.0 (a bank that
  did not grow past its floored base is never taxed); **u_h** = the 99th percentile. Growth the
  distilled policy shows 9 times in 10 is free; growth beyond its 99th percentile costs the full w_pen.
  The penalty is convex (e^{3x}), so growth just above l_h costs almost nothing.
- Malformed writes (policy_error) leave the bank unchanged and are scored at the floor anyway: they
  are left out, as are chunks after a platform fault (their sizes are unknown).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reward.bank_sizes import load_rows

log = logging.getLogger(__name__)


@dataclass
class Calibration:
    """Suggested bounds for one harness and the distribution they came from."""

    harness: str
    lower: float  # l_h
    upper: float  # u_h
    floor_tokens: int
    num_writes: int  # valid (before, after) pairs the quantiles were taken over
    num_first_writes: int  # of which first writes into an empty bank (the floor's sample)
    quantiles: dict[str, float]  # g at p50 / p75 / p90 / p99 / max
    share_penalised: float  # share of the calibration writes with g > l_h
    share_full: float  # share with g >= u_h

    def overrides(self, prefix: str = "reward.scoring.growth_bounds") -> list[str]:
        p = f"{prefix}.{self.harness}"
        return [
            f"{p}.lower={self.lower:.4g}",
            f"{p}.upper={self.upper:.4g}",
            f"{p}.floor_tokens={self.floor_tokens}",
        ]


def write_pairs(rows: list[dict]) -> dict[str, list[tuple[int, int]]]:
    """Per harness, (B_{t-1}, B_t) for every valid write: chunk status ok with a measured size. A row
    stops at its first platform fault (later sizes are unknown); policy errors are skipped."""
    pairs: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in rows:
        if r.get("status") == "platform_error":
            continue
        if len(r["size_tokens"]) != len(r["chunk_status"]):
            raise ValueError(
                f"{r['trajectory_id']}: {len(r['size_tokens'])} sizes for {len(r['chunk_status'])} chunks"
            )
        before = r["parent_size_tokens"]
        for size, status in zip(r["size_tokens"], r["chunk_status"], strict=True):
            if status == "platform_error" or size is None:
                break
            if size < 0 or before < 0:
                raise ValueError(f"{r['trajectory_id']}: negative bank size ({before} -> {size})")
            if status == "ok":
                pairs[r["harness"]].append((int(before), int(size)))
            before = size
    return dict(pairs)


def suggest_floor(pairs: list[tuple[int, int]]) -> tuple[int, int]:
    """(floor, sample size): the median size of a first write into an empty bank; without any, the
    median positive growth of a write."""
    first = [a for b, a in pairs if b == 0 and a > 0]
    if first:
        return max(1, round(float(np.median(first)))), len(first)
    grew = [a - b for b, a in pairs if a > b]
    if not grew:
        raise ValueError("no write ever grew a bank: nothing to calibrate the growth penalty from")
    return max(1, round(float(np.median(grew)))), 0


def calibrate(
    rows: list[dict],
    lower_q: float = 0.9,
    upper_q: float = 0.99,
    floor_tokens: int | None = None,
    min_writes: int = 50,
) -> dict[str, Calibration]:
    if not 0.0 < lower_q < upper_q <= 1.0:
        raise ValueError(f"need 0 < lower_q < upper_q <= 1, got {lower_q}, {upper_q}")
    if floor_tokens is not None and floor_tokens < 1:
        raise ValueError(f"floor_tokens must be >= 1, got {floor_tokens}")
    out = {}
    for h, pairs in sorted(write_pairs(rows).items()):
        if len(pairs) < min_writes:
            raise ValueError(
                f"harness {h!r}: {len(pairs)} valid writes, need >= {min_writes} for quantiles (record more OPD steps)"
            )
        floor, n_first = (
            (floor_tokens, sum(b == 0 and a > 0 for b, a in pairs)) if floor_tokens else suggest_floor(pairs)
        )
        g = np.array([a / max(b, floor) for b, a in pairs])
        # rounded to the 4 significant digits the overrides and the YAML print, before the check: bounds
        # that differ only past them would reach the reward config as upper == lower (and be refused)
        lower = float(f"{max(1.0, float(np.quantile(g, lower_q))):.4g}")
        upper = float(f"{float(np.quantile(g, upper_q)):.4g}")
        if not upper > lower:
            raise ValueError(
                f"harness {h!r}: the {upper_q:.0%} growth ratio {upper:.3g} is not above l_h={lower:.3g} "
                f"(floor {floor}): the writes barely grow the bank; lower the floor or widen the quantiles"
            )
        out[h] = Calibration(
            harness=h,
            lower=lower,
            upper=upper,
            floor_tokens=int(floor),
            num_writes=len(pairs),
            num_first_writes=n_first,
            quantiles={
                q: float(np.quantile(g, v))
                for q, v in (("p50", 0.5), ("p75", 0.75), ("p90", 0.9), ("p99", 0.99))
            }
            | {"max": float(g.max())},
            share_penalised=float((g > lower).mean()),
            share_full=float((g >= upper).mean()),
        )
    if not out:
        raise ValueError("no valid writes recorded: nothing to calibrate")
    return out


def to_yaml(cals: dict[str, Calibration]) -> str:
    lines = [
        "# python -m reward.calibrate_growth: per-harness growth-penalty bounds from OPD rollouts",
        "growth_bounds:",
    ]
    for c in cals.values():
        lines.append(
            f"  {c.harness}: {{lower: {c.lower:.4g}, upper: {c.upper:.4g}, floor_tokens: {c.floor_tokens}}}"
        )
    return "\n".join(lines) + "\n"


def report(cals: dict[str, Calibration]) -> str:
    head = f"{'harness':<14}{'writes':>8}{'floor':>7}{'p50':>7}{'p75':>7}{'p90':>7}{'p99':>7}{'max':>7}{'l_h':>7}{'u_h':>7}{'>l_h':>7}"
    rows = [head]
    for c in cals.values():
        q = c.quantiles
        rows.append(
            f"{c.harness:<14}{c.num_writes:>8}{c.floor_tokens:>7}{q['p50']:>7.2f}{q['p75']:>7.2f}{q['p90']:>7.2f}"
            f"{q['p99']:>7.2f}{q['max']:>7.2f}{c.lower:>7.2f}{c.upper:>7.2f}{c.share_penalised:>7.1%}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m reward.calibrate_growth", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("run_dirs", nargs="+", type=Path, help="OPD run directories (each has bank_sizes.jsonl)")
    ap.add_argument("--lower-q", type=float, default=0.9, help="quantile of g that becomes l_h (default 0.9)")
    ap.add_argument(
        "--upper-q", type=float, default=0.99, help="quantile of g that becomes u_h (default 0.99)"
    )
    ap.add_argument("--floor-tokens", type=int, default=None, help="fix the floor instead of deriving it")
    ap.add_argument("--min-writes", type=int, default=50, help="fewer valid writes per harness is an error")
    ap.add_argument(
        "--out", type=Path, default=None, help="also write the bounds as YAML (growth_bounds: ...)"
    )
    ap.add_argument("--json", action="store_true", help="print the calibration as JSON instead of the table")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        cals = calibrate(load_rows(a.run_dirs), a.lower_q, a.upper_q, a.floor_tokens, a.min_writes)
    except (FileNotFoundError, ValueError) as e:
        print(f"calibrate_growth: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({h: vars(c) for h, c in cals.items()}, indent=1))
    else:
        print(report(cals))
        print("\nHydra overrides:\n  " + " ".join(o for c in cals.values() for o in c.overrides()))
    if a.out:
        a.out.write_text(to_yaml(cals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
