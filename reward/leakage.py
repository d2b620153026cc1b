"""The probe leakage filter: the probes and ORM questions a frozen reader answers from an empty bank.

A probe the reader gets right with no memory at all measures the reader's priors (the question's
wording, a frequent value), not the bank, and would reward a writer for nothing; MemAgent filters its
QA the same way. The check asks the reader every recall probe and ORM question of a built dataset with
an empty bank's search results and scores the answers with the dataset's own scorer (exact match per
gold fact on atomic answers, else the LLM judge). A leaked ORM question is one whose answer recovers
any gold fact. Trap probes are not checked: "no such record" from an empty bank is their right answer.

It writes `<dataset>/leakage.json` (the leaked ids, counts and the leaked share per table), which
`data_pipeline.store.BuiltDataset` reads: training and the held-out evaluation drop the leaked items by
default (`data.keep_leaked=true` keeps them). One dataset directory is one harness configuration, so
the shares printed are per harness.

    python -m reward.leakage runs/demo/data/eval/native --reader extractive
    python -m reward.leakage DATASET... --reader-url http://reader:8001/v1 --reader-model reader \\
        [--judge-url http://judge:8002/v1 --judge-model judge]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_pipeline.store import LEAKAGE_FILE, BuiltDataset, atomic_write_text
from reward.config import LlmClientConfig
from reward.instrument import extractive_answer
from reward.judge import ExactMatchScorer, LlmJudge, OrmVerdict, ProbeItem, QuestionItem, Reader
from reward.llm import ChatClient, Fault


@dataclass
class LeakageReport:
    dataset: str  # the dataset directory
    reader: str  # which reader answered ("extractive" or the endpoint's model at its URL)
    num_probes: int  # recall probes checked (traps are not)
    num_questions: int  # ORM questions checked
    leaked_probes: list[str]  # probe ids answered correctly from an empty bank
    leaked_questions: list[str]  # ORM question ids with a gold fact recovered from an empty bank
    num_faults: int  # items the reader or judge could not answer (not leaked, counted)

    @property
    def leaked_share(self) -> float:
        n = self.num_probes + self.num_questions
        return (len(self.leaked_probes) + len(self.leaked_questions)) / n if n else 0.0

    def to_json(self) -> str:
        d = dict(self.__dict__, leaked_share=self.leaked_share)
        return json.dumps(d, indent=1) + "\n"


class ExtractiveReaderClient:
    """The extractive reader (reward.instrument) in this process, behind `Reader.answer_all`'s contract."""

    stats: dict[str, int] = {}

    def answer_all(self, items) -> list[str | Fault]:
        return [extractive_answer(q, [e.text for e in entries]) for _, q, entries in items]


def check(ds: BuiltDataset, reader: Any, judge: Any, reader_name: str) -> LeakageReport:
    """Ask `reader` (`Reader.answer_all`) every recall probe and ORM question with no records; score with
    `judge` (ExactMatchScorer or LlmJudge)."""
    probes = [p for p in ds.tables["probes"] if not p.is_trap]
    questions = list(ds.tables["orm_questions"])
    items = [(f"probe {p.probe_id}", p.question, []) for p in probes]
    items += [(f"question {q.question_id}", q.question, []) for q in questions]
    answers = reader.answer_all(items)
    faults = sum(isinstance(a, Fault) for a in answers)
    p_ans, q_ans = answers[: len(probes)], answers[len(probes) :]
    p_ok = [(p, a) for p, a in zip(probes, p_ans, strict=True) if not isinstance(a, Fault)]
    z = judge.score_probes([ProbeItem(p.probe_id, p.question, p.reference, p.rubric, a) for p, a in p_ok])
    q_ok = [(q, a) for q, a in zip(questions, q_ans, strict=True) if not isinstance(a, Fault)]
    v = judge.score_questions(
        [
            QuestionItem(
                q.question_id,
                q.question,
                q.answer,
                [g.fact for g in q.gold_facts],
                q.rubric,
                a,
                gold_answers=[g.answer for g in q.gold_facts],
            )
            for q, a in q_ok
        ]
    )
    faults += sum(isinstance(x, Fault) for x in [*z, *v])
    leaked_p = [
        p.probe_id for (p, _), s in zip(p_ok, z, strict=True) if not isinstance(s, Fault) and s >= 0.5
    ]
    leaked_q = [
        q.question_id
        for (q, _), s in zip(q_ok, v, strict=True)
        if isinstance(s, OrmVerdict) and any(s.recovered_F)
    ]
    return LeakageReport(str(ds.root), reader_name, len(probes), len(questions), leaked_p, leaked_q, faults)


def run(dataset: Path, reader: Any, judge: Any, reader_name: str) -> LeakageReport:
    """Check one dataset directory and write its leakage.json (the items of every row are checked,
    whatever an earlier leakage.json dropped)."""
    ds = BuiltDataset(dataset, keep_leaked=True)
    rep = check(ds, reader, judge, reader_name)
    atomic_write_text(Path(dataset) / LEAKAGE_FILE, rep.to_json())
    return rep


def main(argv: list[str] | None = None) -> list[LeakageReport]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("datasets", nargs="+", type=Path, help="built dataset directories (one per harness)")
    ap.add_argument("--reader", choices=["extractive", "endpoint"], default="endpoint")
    ap.add_argument("--reader-url", default="")
    ap.add_argument("--reader-model", default="reader")
    ap.add_argument("--judge-url", default="", help="needed when the dataset's answers are not atomic")
    ap.add_argument("--judge-model", default="judge")
    args = ap.parse_args(argv)
    if args.reader == "extractive":
        reader, name = ExtractiveReaderClient(), "extractive"
    else:
        if not args.reader_url:
            ap.error("--reader-url is required with --reader endpoint")
        reader = Reader(ChatClient(LlmClientConfig(base_url=args.reader_url, model=args.reader_model)))
        name = f"{args.reader_model} at {args.reader_url}"
    reports = []
    for d in args.datasets:
        manifest = BuiltDataset(d, keep_leaked=True).manifest
        if getattr(manifest, "answers_atomic", False):
            judge: Any = ExactMatchScorer(manifest, where=str(d))
        elif args.judge_url:
            judge = LlmJudge(ChatClient(LlmClientConfig(base_url=args.judge_url, model=args.judge_model)))
        else:
            ap.error(f"{d}: answers are not atomic; give --judge-url (the LLM judge scores them)")
        rep = run(d, reader, judge, name)
        reports.append(rep)
        print(
            f"{d}: {len(rep.leaked_probes)}/{rep.num_probes} probes, {len(rep.leaked_questions)}/"
            f"{rep.num_questions} ORM questions leaked ({rep.leaked_share:.1%}; reader: {name}; "
            f"{rep.num_faults} faults)"
        )
    return reports


if __name__ == "__main__":
    main()
