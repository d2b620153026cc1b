"""The lexical reader: an instrument for real-data banks (LoCoMo, LongMemEval), not a model. The
retrieved records in, an answer cut from the one record that shares the most words with the question
out; no LLM, deterministic, English only.

The extractive reader (reward/instrument.py) knows the ledger world's record grammar, which a real
conversation's memories do not follow, and the tiny teacher answers from the question's wording. On
real data this reader is what lets the bound rows (store nothing, gold bank) differ for the bank's
reason alone: it answers from the records the harness retrieved, so an empty bank answers
"no such record" to every question (scored about 0: token F1 credits its "no" against a reference such
as "Likely no"), and a bank holding the answer's words can score.
It is not the report's reader: a table scored with it measures whether the bank holds and retrieves
the answer's words, and says so in its header.

Rules (`lexical_answer`):

- words are lower-cased runs of letters and digits; a question's content words are its words minus
  the stop words below (question words, auxiliaries, pronouns, articles, prepositions); words compare
  by a light stem (a trailing "ing", "ed", "es" or "s" dropped from words of five letters or more);
- each record scores the number of distinct question content words it holds; the best record is the
  highest score, the earlier (better retrieved) on a tie; a best score of 0, or no records: "no such
  record";
- a record's date is the "(said on <date>)" in its text (how the gold writer dates a memory,
  data_pipeline/source_gold.py), else its entry's "(date)" (the harness's metadata), else a "When: <date>"
  line (hy-memory's search results); the date and a leading "Memory: " label are not part of its text;
- a time question ("when ...", "what year / month / date / day ...", "how long ago ...") is answered by
  the best record's date when it has one;
- otherwise the answer is the best record's text without its date, minus the question's words (stop
  words included), in the record's order; the whole text when nothing is left.
"""

from __future__ import annotations

import re

from data_pipeline.schema import NO_SUCH_RECORD

_WORD_RE = re.compile(r"[a-z0-9]+")
_SAID_ON_RE = re.compile(r"\s*\(said on (?P<date>[^()]+)\)")
_WHEN_RE = re.compile(r"^When: (?P<date>.+)$", re.M)
_LABEL_RE = re.compile(r"^Memory: ")
_TIME_RE = re.compile(r"^(?:when\b|what (?:year|month|date|day|time)\b|how long ago\b)")
STOP_WORDS = frozenset(
    """
    a an the and or but of to in on at by for with from about into over after before as than then
    what when where who whom whose which why how is are was were be been being do does did done have has
    had having will would can could should shall may might must i me my mine you your yours he him his
    she her hers it its we us our ours they them their theirs this that these those there here some any
    not no yes s t also just so very likely ever
    """.split()
)


def _stem(w: str) -> str:
    if len(w) >= 5:
        for suffix in ("ing", "ed", "es", "s"):
            if w.endswith(suffix):
                return w[: -len(suffix)]
    return w


def _words(text: str) -> list[str]:
    return _WORD_RE.findall(text.lower())


def content_words(text: str) -> set[str]:
    """The stemmed content words of a text (stop words removed)."""
    return {_stem(w) for w in _words(text) if w not in STOP_WORDS}


def split_date(date: str, text: str) -> tuple[str, str]:
    """(date, text without its date and labels): the "(said on ...)" date first, then the entry's, then a
    "When: ..." line; a "Memory: " label is dropped (hy-memory's search results are "Memory: <text>\nWhen:
    <date>")."""
    said = list(_SAID_ON_RE.finditer(text))
    when = _WHEN_RE.search(text)
    body = _WHEN_RE.sub("", _SAID_ON_RE.sub(" ", text))
    body = _LABEL_RE.sub("", body).strip()
    found = said[-1].group("date").strip() if said else ""
    return found or date or (when.group("date").strip() if when else ""), body


def lexical_answer(question: str, entries: list[tuple[str, str]]) -> str:
    """The answer the (date, text) records give to the question, by the rules of the module docstring."""
    asked = content_words(question)
    best, best_score = None, 0
    for date, text in entries:
        score = len(asked & content_words(split_date(date, text)[1]))
        if score > best_score:
            best, best_score = (date, text), score
    if best is None:
        return NO_SUCH_RECORD
    date, text = split_date(*best)
    if date and _TIME_RE.match(question.strip().lower()):
        return date
    q_words = {_stem(w) for w in _words(question)}
    kept = [tok for tok in text.split() if not any(_stem(w) in q_words for w in _words(tok))]
    kept = [tok for tok in kept if _words(tok)]  # punctuation left alone is no answer
    return " ".join(kept) if kept else text.strip()
