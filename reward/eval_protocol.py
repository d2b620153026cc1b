"""The evaluation protocol per benchmark: which items count, the reader prompt, and how an answer is
scored (the published judge prompt, or a local scorer where the benchmark's metric needs no judge).

`python -m hymem_train.evaluate` looks a benchmark up in `METRICS` by its `EvalItem.benchmark` value.
Judge replies are parsed strictly: a reply that breaks the contract is retried by `ChatClient` and
then becomes a `Fault` (a counted failure excluded from the mean), never a 0 (silent failure platform-error-as-reward).

Sources of the prompts (docs/evaluation.md, "Protocol"): LoCoMo's judge is the one the Mem0 paper
published and every LoCoMo "J" score since uses (mem0ai/mem0 `evaluation/metrics/llm_judge.py`);
LongMemEval's are the per-question-type prompts of its `src/evaluation/evaluate_qa.py`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from data_pipeline.loaders import LOCOMO_CATEGORIES
from reward.judge import READER_SYSTEM, format_memories, normalise_atomic
from reward.llm import ParseError

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Verdict:
    score: float  # in [0, 1]; the cell's mean is over these
    reason: str = ""  # the judge's reply (or the local scorer's explanation), kept in the per-item JSONL


@dataclass(frozen=True)
class Metric:
    """How one benchmark is scored. Exactly one of `judge_messages` (+ `parse`) and `local` is set."""

    benchmark: str  # EvalItem.benchmark this metric scores
    column: str  # the table's column ("LoCoMo Judge", ...)
    # the item counts for the score (LoCoMo's protocol skips category 5, the adversarial questions)
    counts: Callable[[Any], bool] = lambda item: True
    judge_messages: Callable[[Any, str], Messages] | None = None  # (EvalItem, answer) -> judge prompt
    parse: Callable[[str], Verdict] | None = None  # strict: raises ParseError
    local: Callable[[Any, str], Verdict] | None = None  # scored here, no judge call
    # (EvalItem, search results) -> reader prompt; the default asks for a short answer from the records
    reader_messages: Callable[[Any, Sequence[Any]], Messages] | None = None
    # the reader's answer budget, from the benchmark's published protocol, and where that number comes from
    # (docs/evaluation.md, "Reader budgets"); protocol.reader_budget_cap may lower it for a small reader
    reader_max_tokens: int = 0
    reader_budget_source: str = ""
    judge_max_tokens: int = 0  # the published judge budget (0 = the judge client's max_tokens)
    json_reply: bool = False  # the judge's contract is a JSON object (protocol.judge.json_mode applies)
    needs_atomic: bool = False  # exact match: only on datasets whose manifest declares answers_atomic
    category_label: Callable[[str], str] = str  # EvalItem.category -> the breakdown's row name

    def __post_init__(self) -> None:
        if (self.judge_messages is None) == (self.local is None) or (self.judge_messages and not self.parse):
            raise ValueError(f"metric {self.benchmark}: set judge_messages+parse or local, not both")
        if self.reader_max_tokens < 1 or not self.reader_budget_source:
            raise ValueError(f"metric {self.benchmark}: a reader budget and its source are required")

    def reader_prompt(self, item: Any, entries: Sequence[Any]) -> Messages:
        if self.reader_messages is not None:
            return self.reader_messages(item, entries)
        return default_reader_messages(item, entries)


def default_reader_messages(item: Any, entries: Sequence[Any]) -> Messages:
    """The fixed reader's prompt (the RL reward's reader), with the question's date when the benchmark
    gives one (temporal questions are asked relative to it)."""
    asked = f"\nThe question is asked on {item.question_date}." if getattr(item, "question_date", "") else ""
    return [
        {"role": "system", "content": READER_SYSTEM},
        {
            "role": "user",
            "content": f"Memory records:\n{format_memories(entries)}{asked}\n\nQuestion: {item.question}",
        },
    ]


# ------------------------------------------------------------------------------------------ LoCoMo
LOCOMO_JUDGE_PROMPT = """
Your task is to label an answer to a question as 'CORRECT' or 'WRONG'. You will be given the following data:
    (1) a question (posed by one user to another user),
    (2) a 'gold' (ground truth) answer,
    (3) a generated answer
which you will score as CORRECT/WRONG.

The point of the question is to ask about something one user should know about the other user based on their prior conversations.
The gold answer will usually be a concise and short answer that includes the referenced topic, for example:
Question: Do you remember what I got the last time I went to Hawaii?
Gold answer: A shell necklace
The generated answer might be much longer, but you should be generous with your grading - as long as it touches on the same topic as the gold answer, it should be counted as CORRECT.

For time related questions, the gold answer will be a specific date, month, year, etc. The generated answer might be much longer or use relative time references (like "last Tuesday" or "next month"), but you should be generous with your grading - as long as it refers to the same date or time period as the gold answer, it should be counted as CORRECT. Even if the format differs (e.g., "May 7th" vs "7 May"), consider it CORRECT if it's the same date.

Now it's time for the real question:
Question: {question}
Gold answer: {gold_answer}
Generated answer: {generated_answer}

First, provide a short (one sentence) explanation of your reasoning, then finish with CORRECT or WRONG.
Do NOT include both CORRECT and WRONG in your response, or it will break the evaluation script.

Just return the label CORRECT or WRONG in a json format with the key as "label".
"""


def locomo_judge_messages(item: Any, answer: str) -> Messages:
    prompt = LOCOMO_JUDGE_PROMPT.format(
        question=item.question, gold_answer=item.answer, generated_answer=answer
    )
    return [{"role": "user", "content": prompt}]


def parse_locomo_label(text: str) -> Verdict:
    """The published script reads `json["label"]` of the first JSON object in the reply."""
    m = re.search(r"\{.*\}", text, flags=re.S)
    if m is None:
        raise ParseError(f"judge reply has no JSON object: {text[:120]!r}")
    try:
        obj = json.loads(m.group(0))
    except ValueError:
        raise ParseError(f"judge reply's JSON does not parse: {text[:120]!r}") from None
    label = obj.get("label") if isinstance(obj, dict) else None
    if label not in ("CORRECT", "WRONG"):
        raise ParseError(f"judge label must be CORRECT or WRONG, got {label!r}")
    return Verdict(1.0 if label == "CORRECT" else 0.0, text.strip())


# ------------------------------------------------------------------------------------- LongMemEval
_LME_CORE = (
    "I will give you a question, a correct answer, and a response from a model. Please answer yes if the "
    "response contains the correct answer. Otherwise, answer no. If the response is equivalent to the correct "
    "answer or contains all the intermediate steps to get the correct answer, you should also answer yes. If "
    "the response only contains a subset of the information required by the answer, answer no. "
)
_LME_TAIL = "\n\nQuestion: {}\n\nCorrect Answer: {}\n\nModel Response: {}\n\nIs the model response correct? Answer yes or no only."
LONGMEMEVAL_PROMPTS = {
    "single-session-user": _LME_CORE + _LME_TAIL,
    "single-session-assistant": _LME_CORE + _LME_TAIL,
    "multi-session": _LME_CORE + _LME_TAIL,
    "temporal-reasoning": _LME_CORE
    + "In addition, do not penalize off-by-one errors for the number of days. If the question asks for the "
    "number of days/weeks/months, etc., and the model makes off-by-one errors (e.g., predicting 19 days when "
    "the answer is 18), the model's response is still correct. " + _LME_TAIL,
    "knowledge-update": "I will give you a question, a correct answer, and a response from a model. Please "
    "answer yes if the response contains the correct answer. Otherwise, answer no. If the response contains "
    "some previous information along with an updated answer, the response should be considered as correct as "
    "long as the updated answer is the required answer." + _LME_TAIL,
    "single-session-preference": "I will give you a question, a rubric for desired personalized response, and "
    "a response from a model. Please answer yes if the response satisfies the desired response. Otherwise, "
    "answer no. The model does not need to reflect all the points in the rubric. The response is correct as "
    "long as it recalls and utilizes the user's personal information correctly.\n\nQuestion: {}\n\nRubric: {}"
    "\n\nModel Response: {}\n\nIs the model response correct? Answer yes or no only.",
}
LONGMEMEVAL_ABSTENTION = (
    "I will give you an unanswerable question, an explanation, and a response from a model. Please answer yes "
    "if the model correctly identifies the question as unanswerable. The model could say that the information "
    "is incomplete, or some other information is given but the asked information is not.\n\nQuestion: {}\n\n"
    "Explanation: {}\n\nModel Response: {}\n\nDoes the model correctly identify the question as unanswerable? "
    "Answer yes or no only."
)


def longmemeval_judge_messages(item: Any, answer: str) -> Messages:
    # LongMemEval marks abstention items by "_abs" in the question id (the loader keeps it in item_id)
    if item.is_trap or "_abs" in item.item_id:
        template = LONGMEMEVAL_ABSTENTION
    elif item.category in LONGMEMEVAL_PROMPTS:
        template = LONGMEMEVAL_PROMPTS[item.category]
    else:
        raise ValueError(
            f"{item.item_id}: LongMemEval question_type {item.category!r} has no published judge prompt "
            f"(known: {sorted(LONGMEMEVAL_PROMPTS)})"
        )
    return [{"role": "user", "content": template.format(item.question, item.answer, answer)}]


def parse_yes_no(text: str) -> Verdict:
    """The published script scores `'yes' in reply.lower()`; here a reply must also say yes or no as a
    word, so an empty or off-contract reply is retried and then counted as a failure, not as "no"."""
    words = set(re.findall(r"[a-z]+", text.lower()))
    if not words & {"yes", "no"}:
        raise ParseError(f"judge reply says neither yes nor no: {text[:120]!r}")
    return Verdict(1.0 if "yes" in text.lower() else 0.0, text.strip())


def longmemeval_category(category: str) -> str:
    return category


METRICS: dict[str, Metric] = {}


def register(*metrics: Metric) -> None:
    for m in metrics:
        if m.benchmark in METRICS:
            raise ValueError(f"metric for benchmark {m.benchmark!r} registered twice")
        METRICS[m.benchmark] = m


register(
    Metric(
        "locomo",
        "LoCoMo Judge",
        counts=lambda it: it.category != "5",
        judge_messages=locomo_judge_messages,
        parse=parse_locomo_label,
        category_label=lambda c: LOCOMO_CATEGORIES.get(c, c),
        json_reply=True,
        reader_max_tokens=1024,
        reader_budget_source="Mem0's evaluation (evaluation/src/memzero/search.py) sets none, the API default; "
        "1024 bounds a runaway reader far above its 5-6-word answers",
    ),
    Metric(
        "longmemeval_s",
        "LongMemEval",
        judge_messages=longmemeval_judge_messages,
        parse=parse_yes_no,
        judge_max_tokens=10,
        reader_max_tokens=800,
        reader_budget_source="LongMemEval src/generation/run_generation.py: 800 with chain of thought (its "
        "default reading method), 500 without; its judge: 10 (src/evaluation/evaluate_qa.py)",
    ),
    Metric(
        "synthetic",
        "Synthetic (exact match)",
        local=lambda it, a: exact_match(it, a),
        needs_atomic=True,
        reader_max_tokens=64,
        reader_budget_source="this project's synthetic data: atomic answers of a few tokens",
    ),
)


def exact_match(item: Any, answer: str) -> Verdict:
    """Synthetic data only (answers atomic by construction; the planner checks the manifest): a trap's
    reference is "no such record", which the reader says when the bank holds nothing."""
    hit = normalise_atomic(answer) == normalise_atomic(item.answer)
    return Verdict(float(hit), "exact match" if hit else f"expected {item.answer!r}")


def token_f1(prediction: str, reference: str) -> float:
    """LoCoMo's QA metric (its paper's F1): token overlap after lower-casing and dropping punctuation and
    articles (SQuAD normalisation; LoCoMo's script also stems, which this does not)."""

    def norm(s: str) -> list[str]:
        s = re.sub(r"[^\w\s]", " ", s.lower())
        return [w for w in s.split() if w not in ("a", "an", "the", "and")]

    p, r = norm(prediction), norm(reference)
    common = sum((Counter(p) & Counter(r)).values())
    if not p or not r or not common:
        return float(p == r)
    prec, rec = common / len(p), common / len(r)
    return 2 * prec * rec / (prec + rec)


def token_f1_metric(m: Metric) -> Metric:
    """A judged benchmark scored by token F1 instead (protocol.judge_mode=token_f1: a box without a judge
    model). Not the report's protocol: the column says so."""
    return dataclasses.replace(
        m,
        column=f"{m.column} (token F1)",
        judge_messages=None,
        parse=None,
        json_reply=False,
        local=lambda it, a: Verdict(token_f1(a, it.answer), "token F1"),
    )


def metric_for(benchmark: str) -> Metric:
    _load_extra()
    if benchmark not in METRICS:
        raise ValueError(f"no evaluation protocol for benchmark {benchmark!r} (known: {sorted(METRICS)})")
    return METRICS[benchmark]


def _load_extra() -> None:
    """Benchmarks whose protocol lives in its own module register themselves on import."""
    for mod in ("reward.eval_personamem", "reward.eval_memoryarena"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
