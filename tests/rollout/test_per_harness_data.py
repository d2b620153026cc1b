"""Mixed-harness data as the report trains it: each harness configuration declares
its dataset (`data.per_harness`), the same sequence runs in several harnesses as independent lineages,
the schedule reconciles against the mapping (silent failure harness-unscheduled), and the stage prints the per-harness
reward-data table. `data.path` stays the single-dataset shorthand (tests/rollout/test_rollout_worker.py)."""

from __future__ import annotations

import json

import pytest

from data_pipeline.build import build, load_config
from data_pipeline.store import BuiltDataset, HarnessDatasets
from harnesses.native import NativeHarness
from harnesses.registry import HarnessConfig
from hymem_train.config import ConfigError, compose, to_typed
from hymem_train.rollout.collector import RolloutCollector
from hymem_train.rollout.lineage import BankLineage
from hymem_train.rollout.pool import RolloutPool
from hymem_train.rollout.scheduler import WindowScheduler
from hymem_train.run_config import RlConfig
from hymem_train.stage import log_data_table
from reward.schedule import ScheduleError

TWO = ["native", "native_b"]


@pytest.fixture(scope="module")
def other_ds(tmp_path_factory) -> BuiltDataset:
    """A second dataset (3 sequences, another seed): a harness with data of its own."""
    out = tmp_path_factory.mktemp("other")
    cfg = load_config(
        [
            f"out_dir={out}",
            "data.synthetic.num_sequences=3",
            "data.synthetic.num_chunks_per_sequence=4",
            "data.synthetic.num_chunks_per_window=2",
            "data.profiles.hy_memory.num_chunks_per_window=2",
            "data.synthetic.seed=5",
        ]
    )
    return BuiltDataset(build(cfg)[0]["hy_memory"])


def _rl(*overrides: str) -> RlConfig:
    return to_typed(compose("rl", ["+exp=hy_memory_rl", *overrides]), RlConfig)


def test_config_declares_a_dataset_per_harness_and_reconciles():
    cfg = _rl()
    assert set(cfg.data.per_harness) == set(cfg.harnesses) and not cfg.data.path
    # silent failure harness-unscheduled before any work: a declared harness with no data, data for an undeclared one
    with pytest.raises(ScheduleError, match=r"declared harness\(es\) with no dataset: \['mem0'\]"):
        _rl("~data.per_harness.mem0")
    with pytest.raises(ScheduleError, match=r"undeclared harness\(es\): \['everos'\]"):
        _rl("+data.per_harness.everos=/d")
    with pytest.raises(ConfigError, match="set exactly one"):
        _rl("data.path=/d")  # both
    with pytest.raises(ConfigError, match="data.path"):
        to_typed(compose("rl", ["+exp=demo_rl", "data.path="]), RlConfig)  # neither


def test_same_sequence_in_several_harnesses_is_several_lineages(synth_ds, other_ds, tmp_path):
    ws = {"native": synth_ds.windows, "native_b": synth_ds.windows}
    s = WindowScheduler(ws, TWO, tmp_path, growth_bounds={"native": 1, "native_b": 1})
    step = s.next_windows(8)
    seqs = sorted({w.sequence_id for w in synth_ds.windows})
    assert len(step) == 4 and [sw.harness for sw in step] == ["native", "native_b"] * 2  # interleaved
    assert sorted(sw.lineage_id for sw in step) == sorted(f"{h}:{q}" for h in TWO for q in seqs)
    s.advance(step[:2])  # only sequence 0's two lineages finished their window
    resumed = WindowScheduler(ws, TWO, tmp_path)
    assert {sw.lineage_id: sw.window.index for sw in resumed.next_windows(8)} == {
        f"native:{seqs[0]}": 1,
        f"native_b:{seqs[0]}": 1,
        f"native:{seqs[1]}": 0,
        f"native_b:{seqs[1]}": 0,
    }
    manifest = json.loads((tmp_path / "schedule_manifest.json").read_text())
    assert manifest == {"per_harness": {"native": seqs, "native_b": seqs}}
    # each harness its own data: native_b schedules other_ds's 3 sequences, native synth_ds's 2
    mixed = WindowScheduler({"native": synth_ds.windows, "native_b": other_ds.windows}, TWO, tmp_path / "m")
    assert mixed.weights == {"native": 0.4, "native_b": 0.6}


def test_schedule_reconciles_against_the_mapping(synth_ds, tmp_path):
    with pytest.raises(ScheduleError, match=r"no dataset: \['native_b'\]"):
        WindowScheduler({"native": synth_ds.windows}, TWO, tmp_path / "a")
    with pytest.raises(ScheduleError, match=r"undeclared harness\(es\): \['mem0'\]"):
        WindowScheduler({"native": synth_ds.windows, "mem0": synth_ds.windows}, ["native"], tmp_path / "b")
    with pytest.raises(ScheduleError, match=r"declared but never scheduled: \['native_b'\]"):
        WindowScheduler({"native": synth_ds.windows, "native_b": []}, TWO, tmp_path / "c")


def test_resume_across_data_modes_fails_clearly(synth_ds, other_ds, tmp_path):
    old = tmp_path / "old"  # a run of the data.path shorthand (cursor keyed by sequence, as before)
    WindowScheduler(synth_ds.windows, TWO, old).advance([])
    per = {"native": synth_ds.windows, "native_b": synth_ds.windows}
    with pytest.raises(ScheduleError, match="data.path shorthand"):
        WindowScheduler(per, TWO, old)
    new = tmp_path / "new"
    s = WindowScheduler(per, TWO, new)
    legacy = WindowScheduler(synth_ds.windows, TWO, tmp_path / "legacy").state()
    with pytest.raises(ScheduleError, match="another data configuration"):
        s.restore(legacy)  # a checkpoint of a shorthand run
    with pytest.raises(ScheduleError, match="written by a run with data.per_harness"):
        WindowScheduler(synth_ds.windows, TWO, new)
    with pytest.raises(ScheduleError, match="the data changed"):
        WindowScheduler({"native": synth_ds.windows, "native_b": other_ds.windows}, TWO, new)


def test_harness_datasets_shorthand_and_per_harness(synth_ds, other_ds):
    short = HarnessDatasets.from_config(str(synth_ds.root), {}, TWO)
    assert short.round_robin and short.of("native") is short.of("native_b")
    assert short.schedule() == synth_ds.windows
    per = HarnessDatasets.from_config("", {"native": str(synth_ds.root), "native_b": str(other_ds.root)}, TWO)
    assert not per.round_robin and set(per.schedule()) == set(TWO)
    assert len(per.of("native_b").windows) == len(other_ds.windows)
    same = HarnessDatasets({"native": synth_ds.root, "native_b": str(synth_ds.root) + "/"})
    assert same.of("native") is same.of("native_b")  # one directory, read once
    with pytest.raises(KeyError, match="mem0"):
        per.of("mem0")
    assert synth_ds.of("anything") is synth_ds  # one BuiltDataset serves every harness


def test_stage_logs_the_per_harness_table_in_the_report_layout(synth_ds, other_ds, tmp_path):
    per = HarnessDatasets({"native": synth_ds.root, "native_b": other_ds.root})
    table = log_data_table(per, tmp_path)
    head, _, native, native_b = table.strip().splitlines()
    assert head == "| harness config | windows | chunks | recall probes | traps | ORM questions |"
    traps = sum(p.is_trap for p in other_ds.tables["probes"])
    assert native_b.startswith(f"| native_b | {len(other_ds.windows)} | {len(other_ds.tables['chunks'])} | ")
    assert native_b.endswith(f" | {traps} | {len(other_ds.tables['orm_questions'])} |")
    assert native.startswith(f"| native | {len(synth_ds.windows)} |")
    assert (tmp_path / "data_stats.md").read_text() == table


def test_collector_runs_one_window_in_two_harnesses(synth_ds, scripted_gateway, tmp_path):
    """The same window in two harnesses in one step: distinct trajectories, rollout dirs and banks;
    each lineage's next window forks its own promoted bank; the reward group reads its harness's data."""
    cfgs = {h: HarnessConfig(framework="native", in_process=True) for h in TWO}
    srv = scripted_gateway
    pool = RolloutPool(
        {"harnesses": cfgs, "gateway_url": srv.url, "admin_token": srv.gateway.admin_token},
        num_workers=2,
        use_ray=False,
    )
    run = tmp_path / "run"
    data = HarnessDatasets({h: synth_ds.root for h in TWO})
    sched = WindowScheduler({h: synth_ds.windows for h in TWO}, TWO, run)
    lineage = BankLineage(run, lambda name: NativeHarness(None))
    col = RolloutCollector(pool, data, lineage, run, keep_rollout_dirs=True)
    seq = synth_ds.windows[0].sequence_id
    try:
        step1 = [sw for sw in sched.next_windows(8) if sw.window.sequence_id == seq]
        groups = col.collect(step1, 2, step=1)
        tids = [r.record.trajectory_id for g in groups for r in g.results]
        assert len(set(tids)) == 4 and all(t.startswith(("s1-native-", "s1-native_b-")) for t in tids)
        for g in groups:
            assert all(r.record.status == "ok" for r in g.results)
            assert f"/rollouts/step_1/{g.harness}/" in g.results[0].record.final_bank_dir
            col.promote(g, 0)
        banks = {h: lineage.banks[lineage.key(f"{h}:{seq}", 0, 0)] for h in TWO}
        assert banks["native"].bank_dir != banks["native_b"].bank_dir
        assert f"/banks/native_b/{seq.replace('/', '_')}/e0/" in banks["native_b"].bank_dir
        sched.advance(step1)
        step2 = [sw for sw in sched.next_windows(8) if sw.window.sequence_id == seq]
        assert {sw.window.index for sw in step2} == {1}
        groups2 = col.collect(step2, 2, step=2)
    finally:
        pool.shutdown()
    for g in groups2:
        assert g.parent_size == banks[g.harness].size_tokens > 0
        group = g.reward_group(data)
        assert group.harness == g.harness and group.probes == synth_ds.probes_of(g.window)
    assert json.loads((run / "lineage.json").read_text()).keys() == {
        f"native:{seq}@e0/w0",
        f"native_b:{seq}@e0/w0",
    }
