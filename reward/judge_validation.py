"""Judge validation: does a judge endpoint rank 5 synthetic answers per item as expected?

Report section 1: for each item, five synthetic answers are scored by the judge: the reference and a
faithful paraphrase should get full credit, a partial answer partial credit, a distractor (another
item's answer) and a refusal 0. The report's pilot averaged 0.90 on faithful paraphrases.

Answers are built without an LLM:
- reference:  the item's reference answer, verbatim;
- paraphrase: the item's supporting facts restated as sentences ("According to my notes, Alice's dog
              is named Rex."); items with no known fact text get a reworded reference;
- partial:    only the first of >= 2 gold facts (ORM questions); single-fact items have no partial
              answer and are checked on the other four;
- distractor: the reference of another item (seeded choice, different text);
- refusal:    a plain "no record" reply.
Traps are skipped: their reference *is* a refusal.

The judge is any object with `score_probes(items)` / `score_questions(items)` in the reward package's
contract (`reward.judge.LlmJudge` over an OpenAI-compatible endpoint is what `endpoint_judge`
builds): this validates the very prompts and parsers the RL reward uses. A Fault (judge outage,
unparsable verdict) is counted and excluded, never read as a score (silent failure platform-error-as-reward).

It runs inside the data build, which sits below reward and does not import it (docs/architecture.md):

    python -m reward.judge_validation [data build overrides] judge_validation.enabled=true \
        judge_validation.base_url=http://HOST:8000/v1 judge_validation.model=judge

is `python -m data_pipeline.build` with `validation_files` passed in as its judge validator: same
config (configs/data_build.yaml, `judge_validation:` section = `JudgeValidationConfig`), same
outputs, plus `judge_validation.{json,md}` in each profile's dataset directory.
"""

from __future__ import annotations

import json
import logging
import random
import sys
from dataclasses import dataclass, field
from typing import Any

from data_pipeline.build import JudgeValidationConfig
from data_pipeline.build import main as build_main
from data_pipeline.schema import Fact, OrmQuestion, Probe
from reward.judge import LlmJudge, ProbeItem, QuestionItem
from reward.llm import ChatClient, LlmClientConfig

log = logging.getLogger(__name__)
ANSWER_KINDS = ("reference", "paraphrase", "partial", "distractor", "refusal")
EXPECTED = {
    "reference": "full",
    "paraphrase": "full",
    "partial": "partial",
    "distractor": "zero",
    "refusal": "zero",
}
REFUSAL = "I don't have any record of that."
REPORT_PILOT_PARAPHRASE = 0.90  # report section 1: mean judge score of faithful paraphrases


@dataclass
class ValidationItem:
    item_id: str  # probe_id or question_id
    kind: str  # "probe" | "orm"
    question: str
    reference: str
    rubric: str
    gold_facts: list[str]  # ORM gold facts (judge-only) / facts a probe tests
    answers: dict[str, str] = field(default_factory=dict)  # answer kind -> text


def _paraphrase(facts: list[str], reference: str) -> str:
    if facts:
        return "According to my notes, " + "; ".join(f.rstrip(".") for f in facts) + "."
    return f"From what I have stored, it is {reference}."


def build_items(
    probes: list[Probe], questions: list[OrmQuestion], facts: list[Fact], num_items: int, seed: int
) -> list[ValidationItem]:
    """Sample items and give each its five (or four) synthetic answers, deterministically."""
    fact_text = {f.fact_id: f.text for f in facts}
    pool: list[ValidationItem] = []
    for p in probes:
        if p.is_trap:
            continue
        fs = [fact_text[i] for i in p.fact_ids if i in fact_text]
        pool.append(ValidationItem(p.probe_id, "probe", p.question, p.reference, p.rubric, fs))
    for q in questions:
        pool.append(
            ValidationItem(
                q.question_id, "orm", q.question, q.answer, q.rubric, [g.fact for g in q.gold_facts]
            )
        )
    rng = random.Random(seed)
    chosen = sorted(rng.sample(pool, min(num_items, len(pool))), key=lambda it: it.item_id)
    refs = sorted({it.reference for it in pool})
    for it in chosen:
        it.answers["reference"] = it.reference
        it.answers["paraphrase"] = _paraphrase(it.gold_facts, it.reference)
        if it.kind == "orm" and len(it.gold_facts) >= 2:
            it.answers["partial"] = _paraphrase(it.gold_facts[:1], "") + " I have nothing on the rest."
        others = [r for r in refs if r.strip().lower() != it.reference.strip().lower()]
        if others:
            it.answers["distractor"] = rng.choice(others)
        it.answers["refusal"] = REFUSAL
    return chosen


def _grade(score: float, cfg: JudgeValidationConfig) -> str:
    if score >= cfg.full_threshold:
        return "full"
    if score <= cfg.zero_threshold:
        return "zero"
    return "partial"


def score_items(judge: Any, items: list[ValidationItem]) -> list[dict[str, float | None]]:
    """Scores per item and answer kind through the reward judge contract (None = Fault, excluded)."""
    probe_reqs: list[tuple[int, str, Any]] = []
    orm_reqs: list[tuple[int, str, Any]] = []
    for n, it in enumerate(items):
        for kind, ans in it.answers.items():
            where = f"judge-validation {it.item_id} / {kind}"
            if it.kind == "probe":
                probe_reqs.append((n, kind, ProbeItem(where, it.question, it.reference, it.rubric, ans)))
            else:
                orm_reqs.append(
                    (
                        n,
                        kind,
                        QuestionItem(where, it.question, it.reference, list(it.gold_facts), it.rubric, ans),
                    )
                )
    out: list[dict[str, float | None]] = [{} for _ in items]
    for reqs, fn in ((probe_reqs, judge.score_probes), (orm_reqs, judge.score_questions)):
        if not reqs:
            continue
        results = fn([r for _, _, r in reqs])
        for (n, kind, _), res in zip(reqs, results, strict=True):
            score = getattr(res, "score", res)  # OrmVerdict has .score; probe verdicts are floats
            out[n][kind] = float(score) if isinstance(score, int | float) else None
    return out


def summarise(
    items: list[ValidationItem], scores: list[dict[str, float | None]], cfg: JudgeValidationConfig
) -> dict:
    rows = []
    per_kind: dict[str, list[float]] = {k: [] for k in ANSWER_KINDS}
    agree: dict[str, list[bool]] = {k: [] for k in ANSWER_KINDS}
    num_faults = 0
    num_ok = 0
    num_scored = 0
    for it, sc in zip(items, scores, strict=True):
        grades = {}
        for kind in it.answers:
            s = sc.get(kind)
            if s is None:
                num_faults += 1
                continue
            per_kind[kind].append(s)
            grades[kind] = _grade(s, cfg)
            agree[kind].append(grades[kind] == EXPECTED[kind])
        complete = len(grades) == len(it.answers)
        ok = complete and all(grades[k] == EXPECTED[k] for k in grades)
        if complete:
            num_scored += 1
            num_ok += ok
        rows.append(
            {"item_id": it.item_id, "kind": it.kind, "scores": sc, "grades": grades, "as_expected": ok}
        )
    mean = {k: (sum(v) / len(v) if v else None) for k, v in per_kind.items()}
    return {
        "num_items": len(items),
        "num_items_scored": num_scored,  # items with no Fault on any of their answers
        "num_faults": num_faults,  # answer scorings lost to judge faults (excluded)
        "share_ranked_as_expected": (num_ok / num_scored) if num_scored else None,
        "agreement_by_answer": {k: (sum(v) / len(v) if v else None) for k, v in agree.items()},
        "mean_score_by_answer": mean,
        "mean_paraphrase_score": mean["paraphrase"],
        "report_pilot_paraphrase_score": REPORT_PILOT_PARAPHRASE,
        "thresholds": {"full": cfg.full_threshold, "zero": cfg.zero_threshold},
        "items": rows,
    }


def validate_judge(
    judge: Any,
    probes: list[Probe],
    questions: list[OrmQuestion],
    facts: list[Fact],
    cfg: JudgeValidationConfig,
) -> dict:
    items = build_items(probes, questions, facts, cfg.num_items, cfg.seed)
    report = summarise(items, score_items(judge, items), cfg)
    log.info(
        "judge validation: %d items, %.2f ranked as expected, mean paraphrase score %s (report pilot %.2f)",
        report["num_items"],
        report["share_ranked_as_expected"] or 0.0,
        report["mean_paraphrase_score"],
        REPORT_PILOT_PARAPHRASE,
    )
    return report


def endpoint_judge(cfg: JudgeValidationConfig) -> Any:
    """The reward package's LLM judge over the configured endpoint (the real path)."""
    if not cfg.base_url or not cfg.model:
        raise ValueError("judge_validation: base_url and model are required")
    return LlmJudge(
        ChatClient(
            LlmClientConfig(
                base_url=cfg.base_url,
                model=cfg.model,
                api_key=cfg.api_key,
                max_concurrency=cfg.max_concurrency,
            )
        )
    )


def format_report(report: dict) -> str:
    lines = [
        "| answer | expected | mean score | agreement |",
        "|---|---|---|---|",
    ]
    for k in ANSWER_KINDS:
        m, a = report["mean_score_by_answer"][k], report["agreement_by_answer"][k]
        lines.append(
            f"| {k} | {EXPECTED[k]} | {'-' if m is None else f'{m:.2f}'} | {'-' if a is None else f'{a:.2f}'} |"
        )
    share = report["share_ranked_as_expected"]
    lines.append("")
    lines.append(
        f"items ranked as expected: {'-' if share is None else f'{share:.2f}'} of {report['num_items_scored']} "
        f"(faults excluded: {report['num_faults']}); mean paraphrase score "
        f"{report['mean_paraphrase_score']} (report pilot {REPORT_PILOT_PARAPHRASE:.2f})"
    )
    return "\n".join(lines)


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, sort_keys=True)


def validation_files(
    probes: list[Probe], questions: list[OrmQuestion], facts: list[Fact], cfg: JudgeValidationConfig
) -> dict[str, str]:
    """The data build's judge validator: the report of one profile's dataset, as its two files."""
    report = validate_judge(endpoint_judge(cfg), probes, questions, facts, cfg)
    return {
        "judge_validation.json": json.dumps(report, indent=2, sort_keys=True),
        "judge_validation.md": format_report(report) + "\n",
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m data_pipeline.build` with the reward judge passed in (same arguments, same outputs)."""
    return build_main(argv, judge_validator=validation_files, prog="python -m reward.judge_validation")


if __name__ == "__main__":
    sys.exit(main())
