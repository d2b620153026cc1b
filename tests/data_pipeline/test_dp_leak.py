"""Gold facts never reach the bank, the retrieval query or the answer model.

What those three see from the data pipeline: the writer gets `render_chunk(chunk)`; retrieval and
the answer model get the `public_view()` of a probe, ORM question or evaluation item. The annotator
here plants CANARY markers in every fact, reference and answer; none may show up in those views,
while the stored judge-side records do hold them (so the test can fail).
"""

from __future__ import annotations

import json

from data_pipeline import store
from data_pipeline.build import build, load_config
from data_pipeline.chunking import render_chunk
from data_pipeline.synthetic import SyntheticConfig, generate
from tests.doubles.annotator import annotator_responder
from tests.doubles.openai_server import StandInServer

ALLOWED_VIEW_KEYS = {
    "probes": {"probe_id", "question"},
    "orm_questions": {"question_id", "question"},
    "eval_items": {"item_id", "question", "question_date"},
}


def _visible(root) -> list[str]:
    texts = [render_chunk(c) for c in store.read_table(root, "chunks")]
    for table, keys in ALLOWED_VIEW_KEYS.items():
        for rec in store.read_table(root, table):
            view = rec.public_view()
            assert set(view) == keys, (table, set(view))
            texts.append(json.dumps(view))
    return texts


def test_annotated_gold_never_visible(tmp_path, locomo_path):
    cfg = load_config(
        [
            "data=locomo_sample",
            f"out_dir={tmp_path}",
            "data.annotate=true",
            "annotator.model=annotator",
            "annotator.base_url=http://127.0.0.1:1/v1",
            "annotator.progress=false",
            "annotator.num_transport_retries=0",
        ]
    )
    cfg.data.sources = cfg.data.sources[:1]
    cfg.data.sources[0].path = str(locomo_path)
    cfg.data.profiles = {"mem0": cfg.data.profiles["mem0"]}
    with StandInServer(annotator_responder()) as srv:
        cfg.annotator.base_url = srv.base_url
        outs, _ = build(cfg)
    root = outs["mem0"]
    questions = store.read_table(root, "orm_questions")
    facts = store.read_table(root, "facts")
    assert questions and facts and all("CANARY" in g.fact for q in questions for g in q.gold_facts)
    secrets = {g.fact for q in questions for g in q.gold_facts} | {f.text for f in facts}
    secrets |= {q.answer for q in questions} | {p.reference for p in store.read_table(root, "probes")}
    visible = "\n".join(_visible(root))
    assert "CANARY" not in visible
    assert not [s for s in secrets if s in visible]


def test_synthetic_gold_never_visible():
    d = generate(SyntheticConfig(num_sequences=4, num_chunks_per_sequence=10))
    visible = [render_chunk(c) for c in d.chunks]
    visible += [json.dumps(r.public_view()) for r in [*d.probes, *d.orm_questions, *d.eval_items]]
    text = "\n".join(visible)
    gold = {g.fact for q in d.orm_questions for g in q.gold_facts} | {f.text for f in d.facts}
    assert gold and not [g for g in gold if g in text]
    # the views carry no answer of an ORM question either (answers combine two facts: "Rex; Lisbon")
    combined = [q.answer for q in d.orm_questions if "; " in q.answer]
    assert combined and not [a for a in combined if a in text]
    # has_answer (LongMemEval evidence flag) is evaluation-only and never rendered
    assert "has_answer" not in text
