"""Reward-data statistics: the report's table, one row per harness configuration.

Columns as in the report: windows, chunks, recall probes, traps, ORM questions and gold-fact
citations (the number of (question, gold fact) pairs, i.e. how many chunk attributions the ORM can
credit), plus sequences, facts and evaluation items for context, and two health columns:
- annotation failures: failed / attempted annotation calls (PRM per chunk, ORM per window), "-" when
  no annotation pass ran (the build refuses below `annotator.min_success_rate`);
- evidence issues: benchmark evidence ids that are unresolved / recovered (read despite a malformed
  form) / empty (an item with no evidence), from evidence_issues.jsonl.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
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
    ("annotation_failures", "annotation failures"),
    ("evidence_issues", "evidence issues (unresolved/recovered/empty)"),
)

# the report's reward-data table (one row per harness configuration), as a stage prints it at start-up
REPORT_COLUMNS = (
    ("profile", "harness config"),
    ("num_windows", "windows"),
    ("num_chunks", "chunks"),
    ("num_recall_probes", "recall probes"),
    ("num_traps", "traps"),
    ("num_orm_questions", "ORM questions"),
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
    num_annotation_calls: int = 0  # annotation calls attempted (chunks + windows); 0 = no annotation pass
    num_annotation_failures: int = 0  # of those, still failed after retries (annotation_failures.jsonl)
    num_evidence_unresolved: int = 0  # evidence ids resolving to no turn / session, or naming none
    num_evidence_recovered: int = 0  # malformed evidence strings whose ids were all recovered
    num_evidence_empty: int = 0  # eval items with an empty evidence list

    @property
    def annotation_failures(self) -> str:
        if not self.num_annotation_calls:
            return "-"
        return f"{self.num_annotation_failures}/{self.num_annotation_calls}"

    @property
    def evidence_issues(self) -> str:
        return f"{self.num_evidence_unresolved}/{self.num_evidence_recovered}/{self.num_evidence_empty}"


def compute(
    profile: str,
    sequences: list[Sequence],
    chunks: list[Chunk],
    windows: list[Window],
    facts: list[Fact],
    probes: list[Probe],
    questions: list[OrmQuestion],
    eval_items: list[EvalItem],
    num_annotation_calls: int = 0,
    num_annotation_failures: int = 0,
    evidence_statuses: Iterable[str] = (),
) -> Stats:
    statuses = list(evidence_statuses)
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
        num_annotation_calls=num_annotation_calls,
        num_annotation_failures=num_annotation_failures,
        num_evidence_unresolved=statuses.count("unresolved"),
        num_evidence_recovered=statuses.count("recovered"),
        num_evidence_empty=statuses.count("empty"),
    )


def of_tables(profile: str, tables: dict[str, list]) -> Stats:
    """The statistics of a built dataset's tables (`BuiltDataset.tables`), as the row of `profile`."""
    return compute(
        profile,
        tables["sequences"],
        tables["chunks"],
        tables["windows"],
        tables["facts"],
        tables["probes"],
        tables["orm_questions"],
        tables["eval_items"],
    )


def format_table(rows: list[Stats], columns: tuple[tuple[str, str], ...] = COLUMNS) -> str:
    head = "| " + " | ".join(title for _, title in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(str(getattr(r, key)) for key, _ in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def to_json(rows: list[Stats]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=2)
