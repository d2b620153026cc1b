"""Reader, judge and the exact-match scorer.

- The reader answers a probe / question from the harness's own search results, nothing else: it
  never sees the reference, the rubric or the gold facts.
- The judge scores an answer against the reference with the item's rubric. Semantic conditions
  (paraphrase, partial credit, "says nothing was stored" for traps) live in the rubric and the
  judge model, never in string rules in this code (silent failure string-rule-scoring).
- Gold facts go only to the outcome (ORM) judge, which also says which of them were recovered.
- `ExactMatchScorer` exists only for synthetic data whose answers are atomic by construction; it
  refuses any dataset whose manifest does not declare `answers_atomic`. It scores an ORM question
  per gold fact (the answer's ";" parts aligned with the gold facts' answers).

Replies are parsed strictly; a reply that breaks the contract is retried by `ChatClient` and then
becomes a `Fault` (excluded, counted), never a score.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reward.llm import ChatClient, ChatRequest, Fault, ParseError

READER_SYSTEM = (
    "You answer questions about a user using only the memory records below. Answer briefly. "
    "If the records do not contain the answer, reply exactly: no such record"
)
PROBE_JUDGE_SYSTEM = (
    "You grade an answer produced from a memory bank. Compare the candidate answer with the reference "
    "answer and apply the rubric exactly. Reply with one JSON object and nothing else: "
    '{"score": <number from 0 to 1>}'
)
ORM_JUDGE_SYSTEM = (
    "You grade an answer produced from a memory bank. The gold facts are numbered. Decide which gold "
    "facts the candidate answer states (same meaning; paraphrase is fine), and score the answer with "
    "the rubric. Reply with one JSON object and nothing else: "
    '{"score": <number from 0 to 1>, "recovered": [<numbers of the gold facts the answer states>]}'
)
_OPTIONAL_KEYS = {"reason"}  # a short rationale is tolerated; anything else breaks the contract


@dataclass(frozen=True)
class ProbeItem:
    where: str  # "probe <probe_id> / rollout <i>" for messages
    question: str  # the probe question
    reference: str  # reference answer ("no such record" for traps)
    rubric: str  # the item's rubric
    answer: str  # the reader's answer


@dataclass(frozen=True)
class QuestionItem:
    where: str  # "question <question_id> / rollout <i>"
    question: str  # the ORM question
    reference: str  # reference answer (judge-only)
    gold_facts: list[str]  # judge-only, in the question's order
    rubric: str  # the item's rubric
    answer: str  # the reader's answer
    # judge-only: each gold fact's atomic answer span (GoldFact.answer), in order; [] = the reference's parts
    gold_answers: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class OrmVerdict:
    score: float  # the judge's rubric score in [0, 1] (logged; c_q[t] uses `recovered`)
    recovered_F: list[bool]  # per gold fact: did the answer state it


# --------------------------------------------------------------------------------------- parsing
def _json_object(text: str) -> dict[str, Any]:
    """The reply must be exactly one JSON object (one surrounding ```json fence tolerated)."""
    s = text.strip()
    m = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", s, flags=re.S)
    if m:
        s = m.group(1)
    try:
        obj = json.loads(s)
    except ValueError:
        raise ParseError(f"reply is not a JSON object: {text[:120]!r}") from None
    if not isinstance(obj, dict):
        raise ParseError(f"reply is JSON but not an object: {text[:120]!r}")
    return obj


def _score(obj: dict[str, Any]) -> float:
    z = obj.get("score")
    if isinstance(z, bool) or not isinstance(z, int | float) or math.isnan(z) or not 0.0 <= z <= 1.0:
        raise ParseError(f"'score' must be a number in [0, 1], got {z!r}")
    return float(z)


def parse_answer(text: str) -> str:
    s = text.strip()
    if not s:
        raise ParseError("empty answer")
    return s


def parse_probe_verdict(text: str) -> float:
    obj = _json_object(text)
    extra = set(obj) - {"score"} - _OPTIONAL_KEYS
    if extra:
        raise ParseError(f"unexpected key(s) {sorted(extra)} in probe verdict")
    return _score(obj)


def parse_orm_verdict(text: str, num_facts: int) -> OrmVerdict:
    obj = _json_object(text)
    extra = set(obj) - {"score", "recovered"} - _OPTIONAL_KEYS
    if extra:
        raise ParseError(f"unexpected key(s) {sorted(extra)} in outcome verdict")
    score = _score(obj)
    rec = obj.get("recovered")
    if not isinstance(rec, list) or any(isinstance(n, bool) or not isinstance(n, int) for n in rec):
        raise ParseError(f"'recovered' must be a list of gold-fact numbers, got {rec!r}")
    if len(set(rec)) != len(rec) or any(not 1 <= n <= num_facts for n in rec):
        raise ParseError(f"'recovered' {rec} must be distinct numbers in 1..{num_facts}")
    return OrmVerdict(score=score, recovered_F=[(f + 1) in rec for f in range(num_facts)])


# --------------------------------------------------------------------------------------- prompts
def format_memories(entries: Sequence[Any]) -> str:
    """Search results (harnesses.base.MemoryEntry) as numbered lines, with a date when the harness has one."""
    if not entries:
        return "(no records)"
    lines = []
    for k, e in enumerate(entries, 1):
        date = (getattr(e, "metadata", None) or {}).get("date", "")
        lines.append(f"[{k}] {f'({date}) ' if date else ''}{e.text}")
    return "\n".join(lines)


def reader_messages(question: str, entries: Sequence[Any]) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": READER_SYSTEM},
        {"role": "user", "content": f"Memory records:\n{format_memories(entries)}\n\nQuestion: {question}"},
    ]


def probe_judge_messages(item: ProbeItem) -> list[dict[str, str]]:
    user = (
        f"Question: {item.question}\nReference answer: {item.reference}\nRubric: {item.rubric}\n"
        f"Candidate answer: {item.answer}"
    )
    return [{"role": "system", "content": PROBE_JUDGE_SYSTEM}, {"role": "user", "content": user}]


def orm_judge_messages(item: QuestionItem) -> list[dict[str, str]]:
    facts = "\n".join(f"{k}. {f}" for k, f in enumerate(item.gold_facts, 1))
    user = (
        f"Question: {item.question}\nReference answer: {item.reference}\nGold facts:\n{facts}\n"
        f"Rubric: {item.rubric}\nCandidate answer: {item.answer}"
    )
    return [{"role": "system", "content": ORM_JUDGE_SYSTEM}, {"role": "user", "content": user}]


# --------------------------------------------------------------------------------------- clients
class Reader:
    """The fixed answer model: question + the bank's own search results -> a short answer."""

    def __init__(self, client: ChatClient):
        self.client = client

    @property
    def stats(self) -> Counter[str]:
        return self.client.stats

    def answer_all(self, items: Sequence[tuple[str, str, Sequence[Any]]]) -> list[str | Fault]:
        """items: (where, question, search results); one batched round of calls."""
        reqs = [ChatRequest(reader_messages(q, entries), parse_answer, where) for where, q, entries in items]
        return self.client.run_batch(reqs)


class LlmJudge:
    """Rubric judge behind an OpenAI-compatible endpoint."""

    def __init__(self, client: ChatClient):
        self.client = client

    @property
    def stats(self) -> Counter[str]:
        return self.client.stats

    def score_probes(self, items: Sequence[ProbeItem]) -> list[float | Fault]:
        reqs = [ChatRequest(probe_judge_messages(it), parse_probe_verdict, it.where, True) for it in items]
        return self.client.run_batch(reqs)

    def score_questions(self, items: Sequence[QuestionItem]) -> list[OrmVerdict | Fault]:
        reqs = [
            ChatRequest(
                orm_judge_messages(it),
                lambda t, n=len(it.gold_facts): parse_orm_verdict(t, n),
                it.where,
                True,
            )
            for it in items
        ]
        return self.client.run_batch(reqs)


def normalise_atomic(s: str) -> str:
    """Case, width, whitespace and surrounding punctuation only: atomic answers have nothing else."""
    s = unicodedata.normalize("NFKC", s).casefold()
    s = re.sub(r"\s+", " ", s).strip()
    return s.strip(" .,;:!?\"'")


class ExactMatchScorer:
    """Judge stand-in for synthetic data only: 1 if the answer equals the reference, else 0.

    Refuses a dataset whose manifest does not declare `answers_atomic`: on natural data a paraphrase
    would score 0 and that would be a string rule deciding a semantic question (silent failure string-rule-scoring).

    An ORM question is scored per gold fact (`recovered_gold_facts`): where the reference is its gold
    facts' atomic answers "; "-joined in order ("Lisbon; Oslo; Lisbon", "penicillin; blue"), the
    answer's ";" parts are aligned with the gold answers in order and each gold fact the alignment
    matches is recovered, so partial knowledge shows ("Oslo; Lisbon" recovers the last two states);
    score = share recovered. Any other reference (one answer standing for several facts) is all or
    nothing: a match recovers every gold fact, a mismatch none.
    """

    def __init__(self, manifest: Any, *, where: str = "dataset"):
        if not getattr(manifest, "answers_atomic", False):
            name = getattr(manifest, "name", "?")
            raise ValueError(
                f"{where}: dataset {name!r} does not declare answers_atomic=True in its manifest; "
                "exact-match scoring is only allowed on synthetic atomic answers, use the LLM judge"
            )
        self.stats: Counter[str] = Counter()  # calls (no retries, no faults: it is local and total)

    def score_probes(self, items: Sequence[ProbeItem]) -> list[float | Fault]:
        self.stats["calls"] += len(items)
        return [float(normalise_atomic(it.answer) == normalise_atomic(it.reference)) for it in items]

    def score_questions(self, items: Sequence[QuestionItem]) -> list[OrmVerdict | Fault]:
        self.stats["calls"] += len(items)
        out: list[OrmVerdict | Fault] = []
        for it in items:
            rec = recovered_gold_facts(it.answer, it.reference, len(it.gold_facts), it.gold_answers)
            hit = normalise_atomic(it.answer) == normalise_atomic(it.reference)
            out.append(OrmVerdict(score=sum(rec) / len(rec) if rec else float(hit), recovered_F=rec))
        return out


def answer_parts(text: str) -> list[str]:
    """An answer's ";"-separated parts, each normalised (empty parts dropped)."""
    return [p for p in (normalise_atomic(x) for x in text.split(";")) if p]


def recovered_gold_facts(
    answer: str, reference: str, num_facts: int, gold_answers: Sequence[str] = ()
) -> list[bool]:
    """Per gold fact: did the answer state it (ExactMatchScorer's ORM rule).

    The gold answers are `gold_answers` when given (one per fact), else the reference's ";" parts. When
    they are the reference's parts, one per fact, the answer's parts are aligned with them by a longest
    common subsequence; among the longest alignments the one matching the latest facts wins (answer
    "Lisbon" to "Lisbon; Oslo; Lisbon" is the current state: fact 3). Otherwise the whole answer must
    equal the whole reference, and then recovers every fact."""
    ref = answer_parts(reference)
    gold = [normalise_atomic(g) for g in gold_answers] if gold_answers else ref
    if num_facts == 0 or len(gold) != num_facts or gold != ref:
        return [normalise_atomic(answer) == normalise_atomic(reference)] * num_facts
    ans = answer_parts(answer)
    m, n = len(ans), len(gold)
    lcs = [[0] * (n + 1) for _ in range(m + 1)]  # lcs[i][j]: of ans[:i] and gold[:j]
    for i in range(1, m + 1):
        for j in range(1, n + 1):
            same = ans[i - 1] == gold[j - 1]
            lcs[i][j] = lcs[i - 1][j - 1] + 1 if same else max(lcs[i - 1][j], lcs[i][j - 1])
    rec = [False] * n
    i, j = m, n
    while i and j:  # walk back from the ends: each answer part takes the latest fact it can
        if ans[i - 1] == gold[j - 1]:
            rec[j - 1] = True
            i, j = i - 1, j - 1
        elif lcs[i - 1][j] >= lcs[i][j - 1]:  # drop the answer part, keep the later fact in play
            i -= 1
        else:
            j -= 1
    return rec
