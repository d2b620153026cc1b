"""The probe leakage filter (reward.leakage): items a reader answers from an empty bank are found,
recorded in leakage.json, and dropped from the dataset a stage reads unless kept."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from data_pipeline.build import build, load_config
from data_pipeline.ledger import parse_record
from data_pipeline.store import LEAKAGE_FILE, BuiltDataset
from reward.judge import ExactMatchScorer
from reward.leakage import ExtractiveReaderClient, main, run


@pytest.fixture(scope="module")
def ledger_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("leak")
    cfg = load_config(
        [
            f"out_dir={root}",
            "data.name=leak",
            "data.synthetic.world=ledger",
            "data.synthetic.num_sequences=12",
            "data.synthetic.num_chunks_per_sequence=4",
            "data.synthetic.num_chunks_per_window=2",
            "~data.profiles.hy_memory",
            "+data.profiles={native: {mode: session, max_tokens: 0, num_chunks_per_window: 2, tokenizer_path: ''}}",
        ]
    )
    outs, _ = build(cfg)
    return outs["native"]


class PriorReader:
    """A reader that never looks at the bank: it answers each attribute's most frequent value in the
    dataset's gold facts (the priors a tiny LLM reader picks up from its training data)."""

    def __init__(self, ds: BuiltDataset):
        by_attr: dict[str, Counter] = {}
        for f in ds.tables["facts"]:
            r = parse_record(f.text)
            by_attr.setdefault(r.key.split("'s ")[-1], Counter())[r.current] += 1
        self.prior = {a: c.most_common(1)[0][0] for a, c in by_attr.items()}

    def answer_all(self, items):
        out = []
        for _, q, entries in items:
            assert entries == [], "the leakage check must present an empty bank"
            attr = q.rstrip("?").split("'s ")[-1].removesuffix(" change")
            out.append(self.prior.get(attr, "no such record"))
        return out


def test_the_extractive_reader_leaks_nothing_and_the_file_says_so(ledger_ds):
    reports = main([str(ledger_ds), "--reader", "extractive"])
    d = json.loads((ledger_ds / LEAKAGE_FILE).read_text())
    assert d["leaked_probes"] == [] and d["leaked_questions"] == [] and d["leaked_share"] == 0.0
    assert d["num_probes"] == reports[0].num_probes > 20 and d["num_questions"] > 5
    assert d["reader"] == "extractive"


def test_a_reader_answering_from_its_priors_leaks_and_the_leaked_items_are_dropped(ledger_ds, tmp_path):
    full = BuiltDataset(ledger_ds, keep_leaked=True)
    rep = run(ledger_ds, PriorReader(full), ExactMatchScorer(full.manifest), "prior")
    assert rep.leaked_probes, "a reader answering frequent values must get some probes right"
    # every leaked probe really is answered by the prior, and no trap is ever counted
    by_id = {p.probe_id: p for p in full.tables["probes"]}
    assert all(not by_id[i].is_trap for i in rep.leaked_probes)
    assert 0 < rep.leaked_share < 1
    dropped = BuiltDataset(ledger_ds)  # default: the leaked items are gone
    kept_ids = {p.probe_id for p in dropped.tables["probes"]}
    assert kept_ids == set(by_id) - set(rep.leaked_probes)
    assert {q.question_id for q in dropped.tables["orm_questions"]} == {
        q.question_id for q in full.tables["orm_questions"]
    } - set(rep.leaked_questions)
    assert len(dropped.windows) == len(full.windows)
    # the extractive reader, run again, finds nothing: the file is rewritten from every item
    run(ledger_ds, ExtractiveReaderClient(), ExactMatchScorer(full.manifest), "extractive")
    assert len(BuiltDataset(ledger_ds).tables["probes"]) == len(full.tables["probes"])
