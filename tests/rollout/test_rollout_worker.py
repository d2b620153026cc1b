"""Rollout workers, bank lineage and the window scheduler on the native harness and the real gateway."""

import shutil
import sqlite3

import pytest
import torch

from harnesses.base import WriteResult, WriteStatus
from harnesses.native import NativeHarness
from hymem_train.engines.hf import HFEngine
from hymem_train.gateway import Gateway, GatewayConfig, GatewayServer
from hymem_train.models import build_model
from hymem_train.models.tokenizer import default_tokenizer
from hymem_train.rollout.lineage import BankLineage, BankPersistenceError
from hymem_train.rollout.scheduler import WindowScheduler
from hymem_train.rollout.worker import RolloutTask, RolloutWorker, keep_final_attempts
from hymem_train.segments import Segment
from reward.records import RolloutGroup, validate_group
from reward.schedule import ScheduleError


def _worker(srv, cfgs):
    return RolloutWorker(cfgs, srv.url, srv.gateway.admin_token)


def _task(ds, tmp_path, i=0, parent=None, window=0):
    w = ds.windows[window]
    return RolloutTask(w, ds.chunks_of(w), i, "native", parent, str(tmp_path / f"r{i}"), step=0)


def test_rollout_writes_each_chunk_and_snapshots_it(synth_ds, scripted_gateway, native_cfgs, tmp_path):
    res = _worker(scripted_gateway, native_cfgs).run(_task(synth_ds, tmp_path))
    w = synth_ds.windows[0]
    rec = res.record
    assert rec.status == "ok" and [c.chunk_index for c in rec.chunks] == w.chunk_indices
    assert [c.status for c in rec.chunks] == ["ok", "ok"]
    # one LLM call per chunk in the native protocol, each filed under its chunk (silent failure chunk-unmapped)
    assert [s.chunk_index for s in res.segments] == w.chunk_indices == rec.segment_chunks
    sizes = [c.size_tokens for c in rec.chunks]
    assert 0 < sizes[0] <= sizes[1]
    # each snapshot holds the bank right after its chunk
    counts = []
    for c in rec.chunks:
        h = NativeHarness(None)
        h.open(c.bank_dir)
        counts.append(h.count())
        h.close()
    assert 0 < counts[0] <= counts[1]
    validate_group(RolloutGroup(w, "native", 0, [rec], synth_ds.probes_of(w), synth_ds.questions_of(w)))
    # the gateway forgot the trajectory: its credential no longer works
    assert scripted_gateway.gateway.registry.rejected["unknown"] == 0
    assert scripted_gateway.gateway.store.all() == []


def test_tiny_random_policy_gives_policy_errors_not_crashes(synth_ds, native_cfgs, tmp_path):
    torch.manual_seed(0)
    tok = default_tokenizer()
    eng = HFEngine(build_model("tiny", seed=0), [tok.eos_token_id], tok.pad_token_id, max_model_len=2048)
    gw = Gateway(eng, tok, GatewayConfig(embeddings=False))
    native_cfgs["native"].native.max_tokens = 24
    with GatewayServer(gw) as srv:
        res = _worker(srv, native_cfgs).run(_task(synth_ds, tmp_path))
    assert [c.status for c in res.record.chunks] == [
        "policy_error",
        "policy_error",
    ]  # silent failure malformed-as-platform-error
    assert res.record.status == "ok" and res.record.effective_status == "policy_error"
    assert len(res.segments) == 2 and all(s.routed_experts_TLK is not None for s in res.segments)
    assert res.metrics["rollout/policy_error_chunks"] == 2


def test_platform_failure_mid_window_is_a_platform_error(synth_ds, scripted_gateway, native_cfgs, tmp_path):
    eng = scripted_gateway.gateway.engine
    calls = {"n": 0}
    orig = eng.generate

    def flaky(prompts, params):
        calls["n"] += 1
        if calls["n"] >= 2:  # the second chunk's call: the engine dies
            raise RuntimeError("engine crashed")
        return orig(prompts, params)

    eng.generate = flaky
    res = _worker(scripted_gateway, native_cfgs).run(_task(synth_ds, tmp_path))
    assert (
        res.record.status == "platform_error"
    )  # excluded by the reward, never scored (silent failure platform-error-as-reward)
    assert [c.status for c in res.record.chunks] == ["ok", "platform_error"]
    assert len(res.record.chunks) == 2


def test_only_the_final_attempt_of_a_retried_write_is_kept(synth_ds):
    w = synth_ds.windows[0]
    chunks = synth_ds.chunks_of(w)

    def seg(c, k):
        return Segment("t", c, k, [1], [2], [-0.1], "stop")

    segs = [seg(0, 0), seg(0, 1), seg(0, 2), seg(1, 0)]
    writes = [WriteResult(WriteStatus.OK, 1, num_attempts=3), WriteResult(WriteStatus.OK, 1)]
    kept, dropped = keep_final_attempts(segs, chunks, writes)
    assert [(s.chunk_index, s.call_index) for s in kept] == [(0, 2), (1, 0)] and dropped == 2


def test_lineage_promotes_reopens_and_detects_a_lost_bank(synth_ds, scripted_gateway, native_cfgs, tmp_path):
    res = _worker(scripted_gateway, native_cfgs).run(_task(synth_ds, tmp_path))
    run = tmp_path / "run"
    lineage = BankLineage(run, lambda name: NativeHarness(None))
    seq = synth_ds.windows[0].sequence_id
    b = lineage.promote(seq, 0, 0, res.record.final_bank_dir, res.record.trajectory_id, "native")
    assert b.num_entries > 0 and b.known_text
    # a new process (resume) reads the lineage from disk and gets the same, verified parent
    again = BankLineage(run, lambda name: NativeHarness(None))
    assert again.parent(seq, 0, 1) == b.bank_dir and again.parent(seq, 0, 0) is None
    # the next window's rollouts fork it: the known record is there
    res2 = _worker(scripted_gateway, native_cfgs).run(
        _task(synth_ds, tmp_path / "w1", parent=b.bank_dir, window=1)
    )
    h = NativeHarness(None)
    h.open(res2.record.final_bank_dir)
    assert b.known_text in {e.text for e in h.read_all()}
    h.close()
    # silent failure bank-not-carried: the known record's text changed in place, the entry count unchanged
    con = sqlite3.connect(f"{b.bank_dir}/memories.sqlite")
    con.execute("UPDATE memories SET text = ? WHERE id = ?", (b.known_text + " (changed)", int(b.known_id)))
    con.commit()
    n_after = con.execute("SELECT COUNT(*) FROM memories").fetchone()[0]
    assert n_after == b.num_entries
    with pytest.raises(BankPersistenceError, match=f"known record {b.known_id!r} missing or changed"):
        again.parent(seq, 0, 1)
    con.execute("UPDATE memories SET text = ? WHERE id = ?", (b.known_text, int(b.known_id)))
    con.commit()
    assert again.parent(seq, 0, 1) == b.bank_dir  # restored: verified again
    # the promoted bank lost its records on disk -> the next window refuses to start
    con.execute("DELETE FROM memories")
    con.commit()
    con.close()
    with pytest.raises(BankPersistenceError, match="silent failure bank-not-carried"):
        again.parent(seq, 0, 1)
    shutil.rmtree(b.bank_dir)
    with pytest.raises(BankPersistenceError, match="missing"):
        again.parent(seq, 0, 1)
    with pytest.raises(BankPersistenceError, match="no promoted bank for window 1"):
        again.parent(seq, 0, 2)


def test_scheduler_binds_sequences_reconciles_and_resumes(synth_ds, tmp_path):
    ws = synth_ds.windows
    s = WindowScheduler(ws, ["native", "native_b"], tmp_path, growth_bounds={"native": 1, "native_b": 1})
    assert sorted(s.manifest.values()) == ["native", "native_b"]
    step = s.next_windows(8)
    assert len(step) == 2 and {sw.window.index for sw in step} == {0}
    s.advance(step)
    resumed = WindowScheduler(ws, ["native", "native_b"], tmp_path)
    assert {sw.window.index for sw in resumed.next_windows(8)} == {1}
    wrapped = resumed.advance(resumed.next_windows(8))
    assert sorted(wrapped) == sorted({w.sequence_id for w in ws})  # both sequences restart (epoch 1)
    assert {sw.epoch for sw in resumed.next_windows(8)} == {1}
    # silent failure harness-unscheduled: a declared harness config that the schedule never uses fails at start-up
    with pytest.raises(ScheduleError, match="declared but never scheduled"):
        WindowScheduler(ws, ["native", "native_b", "mem0"], tmp_path / "other")
    with pytest.raises(ScheduleError, match="growth_bounds"):
        WindowScheduler(ws, ["native", "native_b"], tmp_path / "x", growth_bounds={"native": 1})


def test_scheduler_state_restores_an_older_cursor(synth_ds, tmp_path):
    """A kill between a step's scheduler write and its checkpoint: the resumed run restores the cursor
    saved in the checkpoint it loads, so no window is skipped."""
    ws = synth_ds.windows
    s = WindowScheduler(ws, ["native"], tmp_path)
    s.advance(s.next_windows(8))
    saved = s.state()  # what checkpoint step 1 holds
    s.advance(s.next_windows(8))  # step 2 advanced, then the run was killed before its checkpoint
    resumed = WindowScheduler(ws, ["native"], tmp_path)
    assert {sw.window.index for sw in resumed.next_windows(8)} == {0} and resumed.epoch != saved["epoch"]
    resumed.restore(saved)
    assert {sw.window.index for sw in resumed.next_windows(8)} == {1}
    assert WindowScheduler(ws, ["native"], tmp_path).state() == saved  # restore is persisted


def test_a_scheduler_starts_over_without_a_checkpoint(synth_ds, tmp_path):
    """Silent failure resume-skips-windows: step 1 advanced the cursor, then the run was killed before any checkpoint was
    complete; the restarted run starts every lineage at its first window (and persists that)."""
    ws = synth_ds.windows
    s = WindowScheduler(ws, ["native"], tmp_path)
    fresh = s.state()
    s.advance(s.next_windows(8))
    restarted = WindowScheduler(ws, ["native"], tmp_path)
    assert {sw.window.index for sw in restarted.next_windows(8)} == {1}  # what scheduler.json says
    restarted.start_over()
    assert restarted.state() == fresh
    assert {sw.window.index for sw in restarted.next_windows(8)} == {0}
    assert WindowScheduler(ws, ["native"], tmp_path).state() == fresh
