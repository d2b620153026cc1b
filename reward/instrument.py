"""The extractive reader: an instrument, not a model. Retrieval results in, an answer extracted from
them out, by the ledger world's record grammar (data_pipeline/ledger.py); no LLM, deterministic.

What it scores holds by construction of the record grammar: a bank whose records answer a question
answers it, a bank that does not says "no such record". So a score measured with it is the bank's
(the writer's), never a reader's guess; `reward.reader_checks` proves that on every ledger dataset
before a run trusts it. `hymem_train/engines/instrument.py` serves it behind the frozen gateway, so
the reward service and the evaluation reach it exactly as they reach an LLM reader.

Rules (`extractive_answer`):

- every record is parsed with `data_pipeline.ledger.parse_record`; a record that does not parse
  (prose a writer stored, a malformed record) is ignored;
- a question names its keys: "How did <key> change?", "What is <key>?" (a key is "<person>'s
  <attribute>"), "What are <person>'s <a> and <b>?" (the keys "<person>'s <a>" and "<person>'s
  <b>"); any other question's keys are the record keys that occur in it (whole words, the longest
  where two overlap), in the order they occur. Keys compare normalised (`normalise_key`); a record
  keyed by the attribute alone ("city: Lisbon": a bank holds one person's records) answers for
  that attribute of whoever the question names;
- "How did <key> change?": the states of the key's record, values only, "; "-joined
  ("Lisbon; Oslo; Lisbon");
- one key: its record's current value;
- several keys: each key's answer, "; "-joined in question order, "no such record" for a key the
  bank lacks;
- several records for one key whose answers differ (a contradiction stored beside the old state as
  a second active fact): the distinct answers joined by " or ", a hedge exact match scores 0;
  identical duplicates answer once;
- no record for any key of the question: "no such record".

`parse_reader_prompt` reads the reader prompt back from the text the engine decodes (the messages of
`reward.judge.reader_messages` / `reward.eval_protocol.default_reader_messages` after the chat
template): the records of the "Memory records:" block ("[k] (date) text" or "[k] text" lines) and the
"Question:" line. Anything else (a writer's request sent to the reader) raises ValueError naming what
is missing.
"""

from __future__ import annotations

import re

from data_pipeline.ledger import LedgerRecord, normalise_key, parse_record
from data_pipeline.schema import NO_SUCH_RECORD

HEDGE = " or "  # joins the differing answers of a contradicted key
SEP = "; "  # joins the parts of a history or of a several-key answer

_HISTORY_RE = re.compile(r"^how did (?P<key>.+?) change\s*\??$")
_ONE_RE = re.compile(r"^what is (?P<key>.+?)\s*\??$")
_SEVERAL_RE = re.compile(
    r"^what are (?P<person>.+)'s (?P<attrs>[a-z]+(?: [a-z]+)*? and [a-z]+(?: [a-z]+)*?)\s*\??$"
)
_PROMPT_RE = re.compile(r"Memory records:\n(?P<block>.*)\n\nQuestion: (?P<question>[^\n]*)", re.S)
_ENTRY_RE = re.compile(r"^\[\d+\] (?:\((?P<date>[^()\n]*)\) )?(?P<text>.*)$")
_ASKED_ON_RE = re.compile(r"^The question is asked on .*\.$")  # eval_protocol's line after the block
NO_RECORDS = "(no records)"  # reward.judge.format_memories of an empty search


def extractive_answer(question: str, records: list[str]) -> str:
    """The answer the records give to the question, by the rules of the module docstring."""
    parsed = [r for r in (parse_record(t) for t in records) if r is not None]
    q = normalise_key(question)
    history = _HISTORY_RE.match(q)
    several = _SEVERAL_RE.match(q)
    one = _ONE_RE.match(q)
    if history:
        keys = [history.group("key")]
    elif several:
        keys = [f"{several.group('person')}'s {a.strip()}" for a in several.group("attrs").split(" and ")]
    elif one:
        keys = [one.group("key")]
    else:
        keys = _keys_in(q, list(dict.fromkeys(normalise_key(r.key) for r in parsed)))
    found = [[r for r in parsed if _same_key(normalise_key(r.key), k)] for k in keys]
    if not any(found):
        return NO_SUCH_RECORD
    return SEP.join(_key_answer(recs, history=bool(history)) for recs in found)


def _split(key: str) -> tuple[str | None, str]:
    """(person, attribute) of a normalised key; person None for a key that is the attribute alone."""
    if "'s " in key:
        person, attr = key.rsplit("'s ", 1)
        return person, attr
    return None, key


def _same_key(record_key: str, question_key: str) -> bool:
    (rp, ra), (qp, qa) = _split(record_key), _split(question_key)
    return ra == qa and (rp is None or qp is None or rp == qp)


def _keys_in(question: str, keys: list[str]) -> list[str]:
    """Record keys occurring in the (normalised) question as whole words, in order of occurrence; a key
    inside a longer matched one ("car" in "car colour") does not count."""
    spans = []
    for k in keys:
        for m in re.finditer(rf"(?<!\w){re.escape(k)}(?!\w)", question):
            spans.append((m.start(), m.end(), k))
    kept = [s for s in spans if not any(o[0] <= s[0] and s[1] <= o[1] and o != s for o in spans)]
    return list(dict.fromkeys(k for _, _, k in sorted(kept)))


def _key_answer(recs: list[LedgerRecord], *, history: bool) -> str:
    if not recs:
        return NO_SUCH_RECORD
    answers = [SEP.join(r.values) if history else r.current for r in recs]
    return HEDGE.join(dict.fromkeys(answers))


def parse_reader_prompt(text: str) -> tuple[str, list[str]]:
    """(question, record texts) of a reader prompt as the engine decodes it (special tokens skipped).
    ValueError naming what is missing when the text is not a reader prompt."""
    question, entries = parse_reader_entries(text)
    return question, [t for _, t in entries]


def parse_reader_entries(text: str) -> tuple[str, list[tuple[str, str]]]:
    """`parse_reader_prompt` with each record's date ("" when its line has none): (question, [(date, text)])."""
    m = _PROMPT_RE.search(text)
    if m is None:
        missing = [
            what
            for what, needle in (
                ("a 'Memory records:' block", "Memory records:\n"),
                ("a 'Question:' line", "\n\nQuestion: "),
            )
            if needle not in text
        ]
        why = (
            f"it has no {' and no '.join(w[2:] for w in missing)}"
            if missing
            else "its 'Question:' line is not after its records"
        )
        raise ValueError(
            f"not a reader prompt: {why} (the extractive reader answers reward.judge.reader_messages): {text[:160]!r}"
        )
    question = m.group("question").strip()
    if not question:
        raise ValueError(f"not a reader prompt: its 'Question:' line is empty: {text[:120]!r}")
    lines = m.group("block").split("\n")
    if lines and _ASKED_ON_RE.match(lines[-1]):
        lines.pop()
    records: list[tuple[str, str]] = []
    for line in lines:
        e = _ENTRY_RE.match(line)
        if e is not None:
            records.append((e.group("date") or "", e.group("text")))
        elif records:  # a record's own line break: the record is prose then, and will not parse
            records[-1] = (records[-1][0], records[-1][1] + "\n" + line)
        elif line.strip() != NO_RECORDS:
            raise ValueError(
                f"not a reader prompt: its records block starts with {line[:80]!r}, not '[1] ...'"
            )
    return question, records
