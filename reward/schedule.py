"""Start-up reconciliation of the harness schedule against the declared harness set (silent failure harness-unscheduled).

A harness configuration that is declared for training but never appears in the schedule manifest
would silently drop out of mixed-harness training (and its growth bounds would never be checked).
The window scheduler calls `reconcile_schedule` once, before any rollout; it raises naming every
missing and every undeclared entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class ScheduleError(ValueError):
    """The schedule manifest and the declared harness set disagree."""


def reconcile_schedule(
    schedule: Mapping[str, float] | Iterable[str],
    declared: Iterable[str],
    *,
    growth_bounds: Mapping[str, object] | None = None,
    where: str = "schedule",
) -> dict[str, float]:
    """Check that the schedule covers exactly the declared harness configurations.

    `schedule` is either a mapping harness-config name -> sampling weight, or the list of names in
    schedule order (each entry counts once). A declared config with weight 0 counts as missing.
    With `growth_bounds` (ScoringConfig.growth_bounds), every scheduled config must have bounds too.
    Returns the normalised weights (sum 1) for logging.
    """
    if isinstance(schedule, Mapping):
        weights = {str(k): float(v) for k, v in schedule.items()}
    else:
        weights = {}
        for name in schedule:
            weights[str(name)] = weights.get(str(name), 0.0) + 1.0
    declared_set = set(declared)
    if not declared_set:
        raise ScheduleError(f"{where}: the declared harness set is empty")
    negative = sorted(k for k, v in weights.items() if v < 0)
    missing = sorted(h for h in declared_set if weights.get(h, 0.0) <= 0.0)
    unknown = sorted(set(weights) - declared_set)
    problems = []
    if negative:
        problems.append(f"negative weight for {negative}")
    if missing:
        problems.append(f"declared but never scheduled: {missing}")
    if unknown:
        problems.append(f"scheduled but not declared: {unknown}")
    if growth_bounds is not None:
        no_bounds = sorted(h for h in declared_set if h not in growth_bounds)
        if no_bounds:
            problems.append(f"no reward growth_bounds for: {no_bounds}")
    if problems:
        raise ScheduleError(f"{where}: " + "; ".join(problems) + " (silent failure harness-unscheduled)")
    total = sum(weights.values())
    return {k: v / total for k, v in sorted(weights.items())}


def reconcile_data(
    per_harness: Mapping[str, object], declared: Iterable[str], *, where: str = "data.per_harness"
) -> None:
    """Check that the per-harness data covers exactly the declared harness configurations: a declared
    harness with no dataset would never be scheduled, a dataset for an undeclared harness would never be
    trained on, and neither may pass silently (silent failure harness-unscheduled). Raises naming every one."""
    declared_set = set(declared)
    no_data = sorted(declared_set - set(per_harness))
    undeclared = sorted(set(per_harness) - declared_set)
    empty = sorted(h for h, p in per_harness.items() if h in declared_set and isinstance(p, str) and not p)
    problems = []
    if no_data:
        problems.append(f"declared harness(es) with no dataset: {no_data}")
    if empty:
        problems.append(f"empty dataset path for: {empty}")
    if undeclared:
        problems.append(f"dataset(s) for undeclared harness(es): {undeclared}")
    if problems:
        raise ScheduleError(f"{where}: " + "; ".join(problems) + " (silent failure harness-unscheduled)")
