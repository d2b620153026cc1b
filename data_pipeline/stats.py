"""Reward-data statistics: the report's table, one row per harness configuration (issue 4 item 6).

Columns as in the report: windows, chunks, recall probes, traps, ORM questions and gold-fact
citations (the number of (question, gold fact) pairs, i.e. how many chunk attributions the ORM can
credit), plus sequences, facts and evaluation items for context.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from data_pipeline.schema import Chunk, EvalItem, Fact, OrmQuestion, Probe, Sequence, Window

COLUMNS = (
    ("profile", "harness config"),
    ("num_sequences", "sequences"),
    ("num_windows", "windows"),
    ("num_chunks", "chunks"),
    ("num_recall_probes", "recall probes"),
    ("num_traps", "traps"),
    ("num_orm_questions", "ORM questions"),
    ("num_gold_fact_citations", "gold-fact citations"),
    ("num_facts", "facts"),
    ("num_eval_items", "eval items"),
)


@dataclass
class Stats:
    profile: str  # harness configuration (chunking profile) name
    num_sequences: int
    num_windows: int
    num_chunks: int
    num_recall_probes: int  # probes with is_trap=False (the five recall kinds)
    num_traps: int  # probes with is_trap=True
    num_orm_questions: int
    num_gold_fact_citations: int  # sum over ORM questions of their gold facts
    num_facts: int
    num_eval_items: int


def compute(
    profile: str,
    sequences: list[Sequence],
    chunks: list[Chunk],
    windows: list[Window],
    facts: list[Fact],
    probes: list[Probe],
    questions: list[OrmQuestion],
    eval_items: list[EvalItem],
) -> Stats:
    return Stats(
        profile=profile,
        num_sequences=len(sequences),
        num_windows=len(windows),
        num_chunks=len(chunks),
        num_recall_probes=sum(not p.is_trap for p in probes),
        num_traps=sum(p.is_trap for p in probes),
        num_orm_questions=len(questions),
        num_gold_fact_citations=sum(len(q.gold_facts) for q in questions),
        num_facts=len(facts),
        num_eval_items=len(eval_items),
    )


def format_table(rows: list[Stats]) -> str:
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    body = ["| " + " | ".join(str(getattr(r, key)) for key, _ in COLUMNS) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def to_json(rows: list[Stats]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=2)
