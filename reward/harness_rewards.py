"""Reward services for a mixed-harness run: one `RewardService` per declared harness configuration
(a reward actor searches banks through one harness). Groups are routed by their harness and the
results come back in group order."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from reward.config import RewardConfig
from reward.records import RolloutGroup
from reward.scoring import ScoringConfig
from reward.service import GroupResult, HarnessFactory, RewardService


class HarnessRewards:
    def __init__(self, cfg: RewardConfig, reader_factories: dict[str, HarnessFactory], manifest: Any = None):
        """`reader_factories`: harness name -> a picklable factory of a read-only harness. `manifest`: the
        dataset manifest, or harness name -> the manifest of that harness's dataset (data.per_harness)."""
        per = manifest if isinstance(manifest, dict) else dict.fromkeys(reader_factories, manifest)
        self.services = {
            name: RewardService(cfg, factory, manifest=per[name])
            for name, factory in reader_factories.items()
        }

    def score_groups(
        self, groups: list[RolloutGroup], scoring: ScoringConfig | None = None
    ) -> list[GroupResult]:
        out: list[GroupResult | None] = [None] * len(groups)
        for name, svc in self.services.items():
            idx = [i for i, g in enumerate(groups) if g.harness == name]
            if idx:
                for i, r in zip(idx, svc.score_groups([groups[i] for i in idx], scoring), strict=True):
                    out[i] = r
        missing = [groups[i].harness for i, r in enumerate(out) if r is None]
        if (
            missing
        ):  # silent failure harness-unscheduled: a group of an undeclared harness must not pass unscored
            raise ValueError(f"no reward service for harness(es) {sorted(set(missing))}")
        return out  # type: ignore[return-value]

    def shutdown(self) -> None:
        for svc in self.services.values():
            svc.shutdown()


def reduce_group_metrics(scored: list[GroupResult]) -> dict[str, float]:
    """The groups' reward/* metrics for the step: call, fault and token counters are sums over groups,
    the other terms are per-group means."""
    per_group: dict[str, list[float]] = defaultdict(list)
    for g in scored:
        for k, v in g.metrics.items():
            per_group[k].append(v)
    summed = ("_calls", "_faults", "_retries", "_tokens")
    return {k: float(np.sum(vs)) if k.endswith(summed) else float(np.mean(vs)) for k, vs in per_group.items()}
