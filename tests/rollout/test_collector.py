"""The rollout collector: bank lineage across windows (silent failure bank-not-carried) and the platform-failed
rollouts it keeps out of training (silent failure platform-error-as-reward).

The lineage test runs the real collector: a thread pool of rollout workers, the native harness in
process, a scripted writer behind the real gateway; every mutation of the parent-bank hand-off
(a window that starts empty) shows as a missing known record.
"""

from __future__ import annotations

import torch

from harnesses.native import NativeHarness
from hymem_train.engines.base import TopKLogprobs
from hymem_train.rollout.collector import RolloutCollector, WindowRollouts
from hymem_train.rollout.lineage import BankLineage
from hymem_train.rollout.pool import RolloutPool
from hymem_train.rollout.scheduler import ScheduledWindow
from hymem_train.rollout.worker import RolloutResult
from hymem_train.segments import Segment
from hymem_train.trainer.items import advantage_items, teacher_items
from reward.records import ChunkSnapshot, RolloutRecord
from reward.scoring import GroupScores
from reward.service import GroupResult


def _texts(bank_dir: str) -> list[str]:
    h = NativeHarness(None)
    h.open(bank_dir)
    try:
        return [e.text for e in h.read_all()]
    finally:
        h.close()


def test_next_window_starts_from_the_promoted_bank(synth_ds, scripted_gateway, native_cfgs, tmp_path):
    """Window k+1's rollouts fork window k's promoted bank: its known record (and every entry) is in
    each rollout's bank after the first chunk of window k+1, which the writer never saw."""
    srv = scripted_gateway
    pool = RolloutPool(
        {"harnesses": native_cfgs, "gateway_url": srv.url, "admin_token": srv.gateway.admin_token},
        num_workers=2,
        use_ray=False,
    )
    lineage = BankLineage(tmp_path / "run", lambda name: NativeHarness(None))
    col = RolloutCollector(pool, synth_ds, lineage, tmp_path / "run", keep_rollout_dirs=True)
    w0 = synth_ds.windows[0]
    w1 = next(w for w in synth_ds.windows if w.sequence_id == w0.sequence_id and w.index == 1)
    try:
        [g0] = col.collect([ScheduledWindow(w0, "native", 0)], 2, step=1)
        assert g0.parent_size == 0 and all(r.record.status == "ok" for r in g0.results)
        key = lineage.key(w0.sequence_id, 0, 0)
        assert col.carry_forward([g0], [None]) == [] and key not in lineage.banks  # retried, not carried
        assert col.carry_forward([g0], [1]) == [g0.scheduled]
        b = lineage.banks[key]
        assert b.num_entries > 0 and b.known_text
        # the next window's growth baseline is the promoted bank as the window's last chunk left it
        sizes = [c.size_tokens for c in g0.results[1].record.chunks]
        assert len(sizes) > 1 and sizes[0] != sizes[-1], sizes  # else the check below could not tell
        assert b.size_tokens == sizes[-1]
        promoted = _texts(b.bank_dir)
        [g1] = col.collect([ScheduledWindow(w1, "native", 0)], 2, step=2)
    finally:
        pool.shutdown()
    assert g1.parent_size == b.size_tokens > 0
    for r in g1.results:
        assert r.record.status == "ok"
        first = _texts(r.record.chunks[0].bank_dir)  # the bank right after window 1's first chunk
        assert b.known_text in first, f"{r.record.trajectory_id}: known record {b.known_text!r} missing"
        assert set(promoted) <= set(first) and len(first) >= len(promoted)
        assert r.record.chunks[0].size_tokens >= b.size_tokens  # it grew from the parent, not from 0
    # the known record came from window 0's chunks only (so an empty start could not re-create it)
    assert not any(b.known_text in str(c) for c in synth_ds.chunks_of(w1))


def _seg(traj: str, chunk: int, call: int = 0) -> Segment:
    return Segment(traj, chunk, call, [1, 2, 3], [10, 11], [-1.0, -1.0], "stop")


def _group(synth_ds, failed: int) -> tuple[WindowRollouts, GroupResult]:
    """3 rollouts of window 0; rollout `failed` crashed in chunk 1 after its chunk-0 call was recorded."""
    w = synth_ds.windows[0]
    c0, c1 = w.chunk_indices
    results = []
    for i in range(3):
        tid = f"s1-r{i}"
        if i == failed:
            snaps = [ChunkSnapshot(c0, "b", 5, "ok"), ChunkSnapshot(c1, "b", None, "platform_error")]
            rec = RolloutRecord(tid, snaps, "platform_error", [c0])
            segs = [_seg(tid, c0)]
        else:
            rec = RolloutRecord(
                tid, [ChunkSnapshot(c0, "b", 5, "ok"), ChunkSnapshot(c1, "b", 9, "ok")], "ok", [c0, c1]
            )
            segs = [_seg(tid, c0), _seg(tid, c1)]
        results.append(RolloutResult(rec, segs, []))
    adv = [[0.7, -0.7] if i != failed else [0.0, 0.0] for i in range(3)]
    valid = [[i != failed] * 2 for i in range(3)]
    scores = GroupScores(adv, adv, adv, adv, valid, adv)
    res = GroupResult(w.window_id, [c0, c1], [r.record.trajectory_id for r in results], scores, 0)
    return WindowRollouts(ScheduledWindow(w, "native", 0), 0, results), res


def test_usable_excludes_platform_errors(synth_ds):
    g, _ = _group(synth_ds, failed=0)
    assert [i for i, _ in g.usable()] == [1, 2]  # OPD promotes usable()[0]: rollout 1, never the crashed 0
    g, _ = _group(synth_ds, failed=1)
    assert [i for i, _ in g.usable()] == [0, 2]


class _Teacher:
    def __init__(self):
        self.seen: list[list[int]] = []

    def topk_logprobs(self, input_ids, k):
        self.seen += input_ids
        return [
            TopKLogprobs(torch.zeros(len(x), k, dtype=torch.long), torch.zeros(len(x), k)) for x in input_ids
        ]


def test_platform_failed_rollouts_are_not_trained_on(synth_ds):
    """Silent failure platform-error-as-reward: the crashed rollout's recorded call gets no train item, neither in RL (with
    its advantage 0) nor in OPD (no teacher call for it)."""
    g, res = _group(synth_ds, failed=1)
    items = advantage_items([g], [res])
    assert sorted(it.segment.trajectory_id for it in items) == ["s1-r0", "s1-r0", "s1-r2", "s1-r2"]
    assert [it.advantage for it in items] == [0.7, -0.7, 0.7, -0.7]
    teacher = _Teacher()
    opd = teacher_items([g], teacher, k=2)
    assert sorted(it.segment.trajectory_id for it in opd) == ["s1-r0", "s1-r0", "s1-r2", "s1-r2"]
    assert len(teacher.seen) == 4  # the teacher never scored the crashed rollout's call
