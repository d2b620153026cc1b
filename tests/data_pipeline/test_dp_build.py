"""The entry point: configs compose and validate, builds write complete datasets, stats match the tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_pipeline import store
from data_pipeline.build import build, load_config, main
from data_pipeline.stats import format_table
from hymem_train.config import CONFIG_DIR, ConfigError

DATA_CONFIGS = sorted(p.stem for p in (Path(CONFIG_DIR) / "data").glob("*.yaml"))


@pytest.mark.parametrize("name", DATA_CONFIGS)
def test_every_data_config_composes_and_validates(name):
    over = [f"data={name}", "out_dir=/tmp/unused"]
    cfg_over = over + ["annotator.base_url=http://127.0.0.1:1/v1", "annotator.model=m"]
    cfg = load_config(cfg_over)
    assert cfg.data.name and cfg.data.sources and cfg.data.profiles


def test_config_errors_name_the_key():
    with pytest.raises(
        ConfigError, match=r"data.profiles.hy_memory.num_chunks_per_windw|num_chunks_per_windw"
    ):
        load_config(["+data.profiles.hy_memory.num_chunks_per_windw=3"])
    with pytest.raises(ConfigError, match=r"data.synthetic.num_sequences"):
        load_config(["data.synthetic.num_sequences=many"])
    with pytest.raises(ConfigError, match=r"data.profiles.hy_memory.*mode=session"):
        load_config(["data.profiles.hy_memory.mode=tokens", "data.profiles.hy_memory.max_tokens=50"])
    with pytest.raises(ConfigError, match=r"annotator.base_url and annotator.model are required"):
        load_config(["data=locomo_sample", "data.annotate=true"])
    with pytest.raises(ConfigError, match=r"data.sources\[0\].kind='csv'"):
        load_config(["data=locomo_sample", "data.sources.0.kind=csv"])


def test_demo_build_writes_complete_dataset(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main([f"out_dir={out}", "data.synthetic.num_sequences=3"]) == 0
    printed = capsys.readouterr().out
    root = out / "hy_memory"
    m = store.read_manifest(root)
    assert m.answers_atomic is True and m.sources == ["synthetic"]
    tables = {t: store.read_table(root, t) for t in m.counts}
    assert {t: len(v) for t, v in tables.items()} == m.counts
    assert len(tables["sequences"]) == 3 and len(tables["chunks"]) == 30 and len(tables["windows"]) == 6
    # the statistics table is printed, saved, and counts what is stored
    stats = json.loads((root / "stats.json").read_text())[0]
    assert stats["num_windows"] == 6 and stats["num_chunks"] == 30
    assert stats["num_recall_probes"] == sum(not p.is_trap for p in tables["probes"])
    assert stats["num_traps"] == sum(p.is_trap for p in tables["probes"]) > 0
    assert stats["num_gold_fact_citations"] == sum(len(q.gold_facts) for q in tables["orm_questions"]) > 0
    assert "| hy_memory | 3 | 6 | 30 |" in printed and (out / "stats.md").read_text() in printed + "\n"
    # the fixed 20% evaluation subsample is a seeded, recorded choice
    sub = m.eval_subsample
    ids = {i.item_id for i in tables["eval_items"]}
    assert sub["seed"] == 0 and sub["fraction"] == 0.2 and set(sub["ids"]["synthetic"]) <= ids
    assert len(sub["ids"]["synthetic"]) == round(0.2 * len(ids))
    # rebuilding gives the same data (deterministic ids, same subsample)
    main([f"out_dir={tmp_path / 'again'}", "data.synthetic.num_sequences=3"])
    assert store.read_table(tmp_path / "again" / "hy_memory", "probes") == tables["probes"]
    assert store.read_manifest(tmp_path / "again" / "hy_memory").eval_subsample == sub


def test_locomo_sample_build_per_harness_profile(tmp_path, locomo_path):
    shared = str(locomo_path.parent.parent)
    cfg = load_config(["data=locomo_sample", f"out_dir={tmp_path}"])
    cfg.data.sources[0].path = f"{shared}/locomo/locomo_sample.json"
    cfg.data.sources[1].path = f"{shared}/longmemeval/longmemeval_s_sample.json"
    outs, rows = build(cfg)
    assert set(outs) == {"mem0", "hy_memory", "memos"}
    by = {r.profile: r for r in rows}
    # session chunking: one chunk per non-empty session of the files
    lme = json.loads((locomo_path.parent.parent / "longmemeval" / "longmemeval_s_sample.json").read_text())
    num_lme = sum(1 for q in lme for s in q["haystack_sessions"] if s)
    assert by["mem0"].num_chunks == 19 + 19 + num_lme
    assert by["hy_memory"].num_chunks >= by["mem0"].num_chunks  # token budget only splits sessions
    for root in outs.values():
        chunks = store.read_table(root, "chunks")
        items = store.read_table(root, "eval_items")
        assert len(items) == 304 + 8
        by_seq = {}
        for c in chunks:
            by_seq.setdefault(c.sequence_id, {})
            for t in c.turns:
                by_seq[c.sequence_id][t.turn_id] = c.index
        # every resolved evidence turn is attributed to the chunk holding it
        for it in items:
            assert it.evidence_chunks == sorted(
                {by_seq[it.sequence_id][t] for t in it.evidence_turn_ids}
            ) or (not it.evidence_turn_ids)
        issues = [json.loads(x) for x in (root / "evidence_issues.jsonl").read_text().splitlines()]
        assert {i["raw"] for i in issues} == {"D8:6; D9:17", ""}
        assert store.read_manifest(root).answers_atomic is False
    assert "| memos |" in format_table(rows)
    # LoCoMo category-5 items with no real answer become natural trap probes of their evidence chunk
    ds = store.BuiltDataset(outs["mem0"])
    adv = [i for i in ds.tables["eval_items"] if i.category == "5" and not i.answer]
    traps = ds.tables["probes"]
    assert len(traps) == len(adv) == 69 and all(p.is_trap and p.reference == "no such record" for p in traps)
    item_by_q = {(i.sequence_id, i.question): i for i in adv}
    for p in traps:
        assert p.chunk_index == max(item_by_q[(p.sequence_id, p.question)].evidence_chunks)
        assert repr(item_by_q[(p.sequence_id, p.question)].adversarial_answer) in p.rubric
    # the window view the rollout / reward code reads
    w = ds.windows[0]
    assert [c.index for c in ds.chunks_of(w)] == w.chunk_indices
    assert {p.chunk_index for p in ds.probes_of(w)} <= set(w.chunk_indices)
    assert sum(len(ds.probes_of(w)) for w in ds.windows) == len(traps)
