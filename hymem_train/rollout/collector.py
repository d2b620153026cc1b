"""The rollout collector: scheduled windows in, one `WindowRollouts` per window out.

It makes the rollout tasks (G per window, each forking the window's verified parent bank), runs
them on the pool, and groups the results by window, so no caller slices a flat result list. It
also owns the bank lineage: the parent-bank look-up (silent failure bank-not-carried) and promotion of the bank
that carries a sequence forward.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hymem_train.rollout.lineage import BankLineage
from hymem_train.rollout.pool import RolloutPool
from hymem_train.rollout.scheduler import ScheduledWindow
from hymem_train.rollout.worker import RolloutResult, RolloutTask
from reward.records import RolloutGroup

PLATFORM_ERROR = "platform_error"


@dataclass
class WindowRollouts:
    """The G rollouts of one window, all forked from the same parent bank."""

    scheduled: ScheduledWindow  # the window, its harness and its sequence's epoch
    parent_size: int  # the parent bank's size in tokens (0 for an empty bank)
    results: list[RolloutResult]  # in rollout-index order (row i of the reward's *_GC tables)
    parent_bank: str | None = None  # the closed parent bank the rollouts forked (None: empty)

    @property
    def window(self) -> Any:
        return self.scheduled.window

    @property
    def harness(self) -> str:
        return self.scheduled.harness

    def usable(self) -> list[tuple[int, RolloutResult]]:
        """(rollout index, result) of every rollout not ended by a platform fault: the rest are
        excluded from scores and training, never scored as policy behaviour (silent failure platform-error-as-reward)."""
        return [(i, r) for i, r in enumerate(self.results) if r.record.status != PLATFORM_ERROR]

    def reward_group(self, dataset: Any) -> RolloutGroup:
        """What the reward service scores: the rollouts with the window's probes and ORM questions."""
        w, ds = self.window, dataset.of(self.harness)  # the harness's own dataset (data.per_harness)
        records = [r.record for r in self.results]
        return RolloutGroup(
            w, self.harness, self.parent_size, records, ds.probes_of(w), ds.questions_of(w), self.parent_bank
        )


def sum_rollout_metrics(groups: list[WindowRollouts]) -> dict[str, float]:
    """The workers' rollout/* and perf/* counters, summed over every rollout of the step."""
    out: dict[str, float] = {}
    for g in groups:
        for r in g.results:
            for k, v in r.metrics.items():
                out[k] = out.get(k, 0.0) + v
    return out


class RolloutCollector:
    """Runs a step's rollouts on the pool and carries each sequence's bank forward."""

    def __init__(
        self,
        pool: RolloutPool | None,
        dataset: Any,  # HarnessDatasets (or one BuiltDataset for every harness): `.of(harness)`
        lineage: BankLineage,
        run_dir: Path,
        *,
        keep_rollout_dirs: bool,
    ):
        self.pool = pool  # None in rollout.mode=train_only (nothing is collected)
        self.dataset = dataset
        self.lineage = lineage
        self.run_dir = Path(run_dir)
        self.keep_rollout_dirs = keep_rollout_dirs

    def collect(self, windows: list[ScheduledWindow], num_rollouts: int, step: int) -> list[WindowRollouts]:
        """G rollouts per window, each from its own fork of the window's verified parent bank."""
        parents, banks, tasks = [], [], []
        for sw in windows:
            w, lid = sw.window, sw.lineage_id  # lineage id: names the harness under data.per_harness
            parent = self.lineage.parent(lid, sw.epoch, w.index)  # verified (silent failure bank-not-carried)
            parents.append(self.lineage.parent_size_tokens(lid, sw.epoch, w.index))
            banks.append(parent)
            chunks = self.dataset.of(sw.harness).chunks_of(w)
            scope = sw.harness if sw.per_harness else ""
            for i in range(num_rollouts):
                out = (
                    self.run_dir
                    / "rollouts"
                    / f"step_{step}"
                    / scope
                    / w.window_id.replace("/", "_")
                    / f"r{i}"
                )
                tasks.append(RolloutTask(w, chunks, i, sw.harness, parent, str(out), step, scope))
        return self._grouped(windows, parents, self._run(tasks), num_rollouts, banks)

    def collect_heldout(
        self, dataset: Any, harness: str, num_rollouts: int, step: int
    ) -> list[WindowRollouts]:
        """Held-out evaluation: the first window of every sequence of `dataset`, from an empty bank;
        nothing is promoted (epoch -1 marks the windows as outside any lineage)."""
        firsts = [ScheduledWindow(w, harness, -1) for w in dataset.windows if w.index == 0]
        tasks = []
        for sw in firsts:
            w = sw.window
            for i in range(num_rollouts):
                out = self.run_dir / "eval" / f"step_{step}" / w.window_id.replace("/", "_") / f"r{i}"
                tasks.append(RolloutTask(w, dataset.chunks_of(w), i, harness, None, str(out), step))
        return self._grouped(firsts, [0] * len(firsts), self._run(tasks), num_rollouts)

    def promote(self, group: WindowRollouts, rollout_index: int) -> None:
        """The rollout's final bank becomes the parent of its sequence's next window (reopened from
        disk and checked against a known record first: silent failure bank-not-carried)."""
        sw, rec = group.scheduled, group.results[rollout_index].record
        w = sw.window
        self.lineage.promote(
            sw.lineage_id,
            sw.epoch,
            w.index,
            rec.final_bank_dir,
            rec.trajectory_id,
            sw.harness,
            size_tokens=rec.chunks[-1].size_tokens or 0,
        )

    def carry_forward(self, groups: list[WindowRollouts], chosen: list[int | None]) -> list[ScheduledWindow]:
        """Each group's chosen rollout carries its bank on (`promote`); None leaves the window to be
        retried next step from the same parent. Returns the windows done, for `scheduler.advance`."""
        done = []
        for g, i in zip(groups, chosen, strict=True):
            if i is not None:
                self.promote(g, i)
                done.append(g.scheduled)
        return done

    def clean(self, step: int) -> None:
        if not self.keep_rollout_dirs:
            shutil.rmtree(self.run_dir / "rollouts" / f"step_{step}", ignore_errors=True)

    def _run(self, tasks: list[RolloutTask]) -> list[RolloutResult]:
        if self.pool is None:
            raise RuntimeError("rollout.mode=train_only has no rollout pool: nothing can be collected")
        return self.pool.run(tasks)

    @staticmethod
    def _grouped(
        windows: list[ScheduledWindow],
        parent_sizes: list[int],
        results: list[RolloutResult],
        num_rollouts: int,
        parent_banks: list[str | None] | None = None,
    ) -> list[WindowRollouts]:
        if len(results) != len(windows) * num_rollouts:
            raise RuntimeError(
                f"rollout pool returned {len(results)} results for {len(windows)} x {num_rollouts} tasks"
            )
        it = iter(results)
        banks = parent_banks or [None] * len(windows)
        return [
            WindowRollouts(sw, size, [next(it) for _ in range(num_rollouts)], bank)
            for sw, size, bank in zip(windows, parent_sizes, banks, strict=True)
        ]
