"""Benchmark loaders: original file layouts -> Sequences + EvalItems.

- LoCoMo `locomo10.json`: a list of samples {sample_id, conversation{speaker_a, speaker_b, session_N,
  session_N_date_time}, qa[{question, answer | adversarial_answer, evidence, category}], observation}.
  Categories are kept as the source's numbers ("1".."5"); we use the original release's mapping
  (LOCOMO_CATEGORIES: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial) and do not
  relabel (some harnesses' evaluations swap 1 and 4). Category 5 items are natural traps (is_trap).
- LongMemEval `longmemeval_s / _m / _oracle` JSON: a list of questions, each with its own haystack
  sessions; one question = one Sequence (its haystack) + one EvalItem. `*_abs` questions are traps.
- Generic JSONL (docs/data.md): one Sequence per line (Sequence.to_dict()) plus an optional `qa` list of
  GenericQa; PersonaMem-v2, MemoryArena, CMB and coding traces are converted into it.

Evidence ids that are malformed (`"D8:6; D9:17"`, `"D"`) or resolve to no turn are never dropped
silently: each becomes an EvidenceIssue naming the file, sample, item and question, is logged, is
kept on the item (`evidence_issues`) and is written to `evidence_issues.jsonl` by the build.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_pipeline.schema import EvalItem, Record, RecordError, Sequence, Session, Turn

log = logging.getLogger(__name__)

LOCOMO_CATEGORIES = {
    "1": "multi-hop",
    "2": "temporal",
    "3": "open-domain",
    "4": "single-hop",
    "5": "adversarial",
}
_LOCOMO_TURN_ID = re.compile(r"^D(\d+):(\d+)$")
# every id written inside an evidence string, tolerating the variants the files hold: "D8:6; D9:17",
# "D30:05" (zero-padded), "D:11:26" (a stray colon after D), "D11: 26"
_LOCOMO_LOOSE_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
# the top-level keys that tell the source layouts apart (a file passed as the wrong kind says so)
_KIND_KEYS = {
    "locomo": ("sample_id", "conversation"),
    "longmemeval": ("question_id", "haystack_sessions"),
    "jsonl": ("sequence_id", "sessions"),
}
EVIDENCE_STATUSES = ("unresolved", "recovered", "empty")


@dataclass
class EvidenceIssue(Record):
    file: str  # source file
    sample_id: str  # benchmark sample / sequence id
    item_id: str  # EvalItem.item_id
    question: str  # the question the bad evidence belongs to
    raw: str  # the evidence string as written
    reason: str  # what is wrong
    resolved: list[str] = field(default_factory=list)  # ids recovered from it (may be empty)
    # "unresolved": some id it names resolves to no turn / session (or it names none);
    # "recovered": every id it names was read despite the malformed form; "empty": no evidence given
    status: str = ""

    def __post_init__(self) -> None:
        if not self.status:
            if not self.raw:
                self.status = "empty"
            elif self.resolved and "unresolved" not in self.reason:
                self.status = "recovered"
            else:
                self.status = "unresolved"

    def short(self) -> str:
        return f"{self.raw!r}: {self.reason}" + (f" -> {self.resolved}" if self.resolved else "")


@dataclass
class SeedFact:
    """A source-provided atomic fact (LoCoMo `observation`), attributed to a chunk after chunking."""

    sequence_id: str
    text: str
    turn_ids: list[str]


@dataclass
class LoadResult:
    sequences: list[Sequence] = field(default_factory=list)
    eval_items: list[EvalItem] = field(default_factory=list)
    issues: list[EvidenceIssue] = field(default_factory=list)
    seed_facts: list[SeedFact] = field(default_factory=list)

    def extend(self, other: LoadResult) -> None:
        self.sequences += other.sequences
        self.eval_items += other.eval_items
        self.issues += other.issues
        self.seed_facts += other.seed_facts


def _need(obj: Any, key: str, types: type | tuple[type, ...], where: str, path: str) -> Any:
    if not isinstance(obj, dict):
        raise RecordError(f"{where}: field '{path}' parent is not a mapping")
    if key not in obj:
        raise RecordError(f"{where}: missing field '{path}'")
    v = obj[key]
    if not isinstance(v, types) or isinstance(v, bool) and bool not in _as_tuple(types):
        want = "/".join(t.__name__ for t in _as_tuple(types))
        raise RecordError(f"{where}: field '{path}' must be {want}, got {type(v).__name__}")
    return v


def _as_tuple(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


def _read_text(path: Path) -> str:
    if not path.exists():
        raise RecordError(f"{path}: no such file")
    if path.is_dir():
        raise RecordError(f"{path}: is a directory, not a data file")
    return path.read_text()


def _read_json(path: Path, kind: str) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data" and text.lstrip().startswith("{"):
            raise RecordError(
                f"{path}: holds one JSON object per line (the generic JSONL layout), not the {kind} "
                "layout (one JSON list); set this source's kind to 'jsonl'"
            ) from None
        raise RecordError(
            f"{path}: not valid JSON (truncated?) at line {e.lineno} col {e.colno}: {e.msg}"
        ) from None


def looks_like(record: Any) -> str | None:
    """The source kind whose layout a top-level record has (by its identifying keys), or None."""
    if not isinstance(record, dict):
        return None
    for kind, keys in _KIND_KEYS.items():
        if all(k in record for k in keys):
            return kind
    return None


def _check_kind(path: Path, record: Any, kind: str, n: int) -> None:
    """A record lacking this kind's keys but having another kind's: say the file is the other kind."""
    other = looks_like(record)
    if other is not None and other != kind:
        have = ", ".join(repr(k) for k in _KIND_KEYS[other])
        want = ", ".join(repr(k) for k in _KIND_KEYS[kind])
        raise RecordError(
            f"{path}: looks like a {other} file, not {kind} (record #{n} has {have}, not {want}); "
            f"set this source's kind to '{other}'"
        )


def _answer_text(v: Any) -> str:
    return "" if v is None else str(v)


# ---------------------------------------------------------------------------------------------------
# LoCoMo


def parse_locomo_evidence(raw: str, known: set[str]) -> tuple[list[str], str | None]:
    """One evidence string -> (resolved turn ids, problem or None)."""
    if raw in known:
        return [raw], None
    ids = list(dict.fromkeys(f"D{int(a)}:{int(b)}" for a, b in _LOCOMO_LOOSE_ID.findall(raw)))
    if not ids:
        return [], "malformed evidence id (no D<session>:<turn> inside)"
    resolved = [i for i in ids if i in known]
    missing = [i for i in ids if i not in known]
    if len(ids) == 1 and len(_LOCOMO_LOOSE_ID.findall(raw)) == 1:
        (norm,) = ids
        if raw == norm:
            return [], "turn id resolves to no turn"
        what = "zero-padded turn id" if _LOCOMO_TURN_ID.match(raw) else f"nonstandard turn id {raw!r}"
        if missing:
            return [], f"{what}, read as {norm}; unresolved: {missing}"
        return [norm], f"{what}, read as {norm}"
    # "D8:6; D9:17" lists two ids in one string
    reason = f"malformed evidence string holding {len(ids)} id(s)"
    if missing:
        reason += f"; unresolved: {missing}"
    return resolved, reason


def load_locomo(path: str | Path, source: str = "locomo", allow_session_gaps: bool = False) -> LoadResult:
    """`allow_session_gaps`: load a conversation whose session numbers have gaps (warned) instead of
    refusing it; a gap in a benchmark file almost always means a corrupted or hand-edited file."""
    path = Path(path)
    data = _read_json(path, "locomo")
    if not isinstance(data, list):
        raise RecordError(f"{path}: top level must be a list of samples, got {type(data).__name__}")
    out = LoadResult()
    for n, sample in enumerate(data):
        where0 = f"{path} sample #{n}"
        _check_kind(path, sample, "locomo", n)
        sample_id = _need(sample, "sample_id", str, where0, "sample_id")
        where = f"{path} sample {sample_id}"
        seq_id = f"{source}/{sample_id}"
        conv = _need(sample, "conversation", dict, where, "conversation")
        speakers = [conv[k] for k in ("speaker_a", "speaker_b") if isinstance(conv.get(k), str)]
        numbers = sorted(
            int(m.group(1)) for k in conv if (m := re.fullmatch(r"session_(\d+)", k)) is not None
        )
        _check_session_numbers(path, sample, sample_id, numbers, allow_session_gaps)
        sessions = []
        for s in numbers:
            key = f"session_{s}"
            turns_raw = _need(conv, key, list, where, f"conversation.{key}")
            date = conv.get(f"{key}_date_time", "")
            if not isinstance(date, str):
                raise RecordError(f"{where}: field 'conversation.{key}_date_time' must be str")
            turns = []
            for i, t in enumerate(turns_raw):
                p = f"conversation.{key}[{i}]"
                turns.append(
                    Turn(
                        turn_id=_need(t, "dia_id", str, where, f"{p}.dia_id"),
                        speaker=_need(t, "speaker", str, where, f"{p}.speaker"),
                        text=_need(t, "text", str, where, f"{p}.text"),
                        image_caption=str(t.get("blip_caption") or ""),
                    )
                )
            sessions.append(Session(session_id=key, date=date, turns=turns))
        seq = Sequence(sequence_id=seq_id, source=source, sessions=sessions, speakers=speakers)
        _check_unique_turns(seq, where)
        known = {t.turn_id for t in seq.turns()}
        out.sequences.append(seq)

        for k, qa in enumerate(_need(sample, "qa", list, where, "qa")):
            p = f"qa[{k}]"
            question = _need(qa, "question", str, where, f"{p}.question")
            category = str(_need(qa, "category", int, where, f"{p}.category"))
            if category not in LOCOMO_CATEGORIES:
                raise RecordError(
                    f"{where}: field '{p}.category' = {category} not in {sorted(LOCOMO_CATEGORIES)}"
                )
            evidence = _need(qa, "evidence", list, where, f"{p}.evidence")
            item_id = f"{seq_id}/q{k:03d}"
            ids: list[str] = []
            item_issues = []
            for raw in evidence:
                if not isinstance(raw, str):
                    raise RecordError(f"{where}: field '{p}.evidence' holds a {type(raw).__name__}")
                resolved, problem = parse_locomo_evidence(raw, known)
                ids += [i for i in resolved if i not in ids]
                if problem:
                    item_issues.append(
                        EvidenceIssue(str(path), sample_id, item_id, question, raw, problem, resolved)
                    )
            if not evidence:
                item_issues.append(
                    EvidenceIssue(str(path), sample_id, item_id, question, "", "empty evidence list")
                )
            is_trap = category == "5"
            if not is_trap and "answer" not in qa:
                raise RecordError(f"{where}: missing field '{p}.answer' (category {category})")
            out.eval_items.append(
                EvalItem(
                    item_id=item_id,
                    benchmark=source,
                    sequence_id=seq_id,
                    question=question,
                    answer=_answer_text(qa.get("answer")),
                    category=category,
                    evidence_turn_ids=ids,
                    is_trap=is_trap,
                    adversarial_answer=_answer_text(qa.get("adversarial_answer")),
                    evidence_issues=[i.short() for i in item_issues],
                )
            )
            out.issues += item_issues

        for sess_key, by_speaker in (sample.get("observation") or {}).items():
            if not isinstance(by_speaker, dict):
                raise RecordError(f"{where}: field 'observation.{sess_key}' must be a mapping")
            for speaker, facts in by_speaker.items():
                for j, entry in enumerate(facts):
                    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
                        raise RecordError(
                            f"{where}: field 'observation.{sess_key}.{speaker}[{j}]' is not [text, id]"
                        )
                    raw_ids = entry[1] if isinstance(entry[1], list) else [entry[1]]
                    ids = [i for r in raw_ids for i in parse_locomo_evidence(str(r), known)[0]]
                    if ids:  # an observation whose turn is unknown cannot be attributed to a chunk
                        out.seed_facts.append(SeedFact(seq_id, entry[0], ids))
    _log_issues(path, out.issues)
    return out


def _check_session_numbers(
    path: Path, sample: dict, sample_id: str, numbers: list[int], allow_gaps: bool
) -> None:
    """Sessions are numbered 1..N; a missing one silently drops its turns, observations and traps.

    The numbers the sample's `observation` / `session_summary` name count too (a removed last session
    leaves them behind). `session_N_date_time` keys do not: the original files carry dates for
    sessions they do not hold (conv-26 has dates up to session_35 and 19 sessions).
    """
    named = set(numbers)
    for key in ("observation", "session_summary"):
        if isinstance(sample.get(key), dict):
            named |= {int(m.group(1)) for k in sample[key] if (m := re.fullmatch(r"session_(\d+)_\w+", k))}
    missing = sorted(set(range(1, max(named, default=0) + 1)) - set(numbers))
    if not missing:
        return
    names = ", ".join(f"session_{i}" for i in missing)
    msg = (
        f"{path} sample {sample_id}: field 'conversation' has no {names} (sessions present: "
        f"{_ranges(numbers) or 'none'}); a gap usually means a corrupted or edited file"
    )
    if not allow_gaps:
        raise RecordError(msg + "; to load it anyway: data.allow_session_gaps=true")
    log.warning("%s; loaded anyway (data.allow_session_gaps=true)", msg)


def _ranges(numbers: list[int]) -> str:
    """[2, 3, 4, 7] -> "2-4, 7"."""
    parts: list[str] = []
    for x in numbers:
        if parts and parts[-1][1] == x - 1:
            parts[-1][1] = x
        else:
            parts.append([x, x])  # type: ignore[arg-type]
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)


def _check_unique_turns(seq: Sequence, where: str) -> None:
    seen: set[str] = set()
    for t in seq.turns():
        if t.turn_id in seen:
            raise RecordError(f"{where}: duplicate turn id {t.turn_id!r} in sequence {seq.sequence_id}")
        seen.add(t.turn_id)


def _log_issues(path: Path, issues: list[EvidenceIssue]) -> None:
    for i in issues:
        log.warning("%s: %s item %s (%r): evidence %s", path, i.sample_id, i.item_id, i.question, i.short())


# ---------------------------------------------------------------------------------------------------
# LongMemEval


def load_longmemeval(path: str | Path, source: str = "longmemeval_s") -> LoadResult:
    path = Path(path)
    data = _read_json(path, "longmemeval")
    if not isinstance(data, list):
        raise RecordError(f"{path}: top level must be a list of questions, got {type(data).__name__}")
    out = LoadResult()
    for n, q in enumerate(data):
        _check_kind(path, q, "longmemeval", n)
        qid = _need(q, "question_id", str, f"{path} record #{n}", "question_id")
        where = f"{path} question {qid}"
        seq_id = f"{source}/{qid}"
        sids = _need(q, "haystack_session_ids", list, where, "haystack_session_ids")
        dates = _need(q, "haystack_dates", list, where, "haystack_dates")
        hay = _need(q, "haystack_sessions", list, where, "haystack_sessions")
        if not len(sids) == len(dates) == len(hay):
            raise RecordError(
                f"{where}: field 'haystack_sessions' has {len(hay)} sessions but {len(sids)} ids and {len(dates)} dates"
            )
        sessions = []
        for s, (sid, date, turns_raw) in enumerate(zip(sids, dates, hay, strict=True)):
            if not isinstance(turns_raw, list):
                raise RecordError(f"{where}: field 'haystack_sessions[{s}]' must be a list")
            turns = []
            for i, t in enumerate(turns_raw):
                p = f"haystack_sessions[{s}][{i}]"
                turns.append(
                    Turn(
                        turn_id=f"{sid}:{i}",
                        speaker=_need(t, "role", str, where, f"{p}.role"),
                        text=_need(t, "content", str, where, f"{p}.content"),
                        has_answer=bool(t.get("has_answer", False)),
                    )
                )
            sessions.append(Session(session_id=str(sid), date=str(date), turns=turns))
        seq = Sequence(sequence_id=seq_id, source=source, sessions=sessions, speakers=["user", "assistant"])
        _check_unique_turns(seq, where)
        out.sequences.append(seq)

        question = _need(q, "question", str, where, "question")
        if "answer" not in q:
            raise RecordError(f"{where}: missing field 'answer'")
        item_id = f"{seq_id}/q000"
        issues = []
        ev_sessions = []
        for raw in _need(q, "answer_session_ids", list, where, "answer_session_ids"):
            if raw in sids:
                ev_sessions.append(str(raw))
            else:
                issues.append(
                    EvidenceIssue(str(path), qid, item_id, question, str(raw), "session id not in haystack")
                )
        out.eval_items.append(
            EvalItem(
                item_id=item_id,
                benchmark=source,
                sequence_id=seq_id,
                question=question,
                answer=_answer_text(q["answer"]),
                category=_need(q, "question_type", str, where, "question_type"),
                evidence_turn_ids=[t.turn_id for t in seq.turns() if t.has_answer],
                evidence_session_ids=ev_sessions,
                is_trap=qid.endswith("_abs"),  # LongMemEval abstention questions: nothing to recall
                question_date=str(q.get("question_date", "")),
                evidence_issues=[i.short() for i in issues],
            )
        )
        out.issues += issues
    _log_issues(path, out.issues)
    return out


# ---------------------------------------------------------------------------------------------------
# generic JSONL


@dataclass
class GenericQa(Record):
    question: str  # the question
    answer: str  # gold answer text
    category: str = ""  # source label
    evidence_turn_ids: list[str] = field(default_factory=list)  # Turn.turn_id values
    evidence_session_ids: list[str] = field(default_factory=list)  # Session.session_id values
    is_trap: bool = False  # nothing in the sequence answers it
    question_date: str = ""  # "asked on" timestamp


def load_generic_jsonl(path: str | Path, source: str | None = None) -> LoadResult:
    """One JSON object per line: Sequence fields + optional `qa` (list of GenericQa)."""
    path = Path(path)
    out = LoadResult()
    text = _read_text(path)
    if text.lstrip().startswith("["):
        try:
            first = json.loads(text)[0]
        except (json.JSONDecodeError, IndexError, KeyError, TypeError):
            first = None
        other = looks_like(first)
        raise RecordError(
            f"{path}: is one JSON list, not JSON Lines (one object per line)"
            + (f"; it looks like a {other} file: set this source's kind to '{other}'" if other else "")
        )
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise RecordError(f"{path}:{lineno}: not valid JSON (truncated?): {e.msg}") from None
        rid = obj.get("sequence_id", "?") if isinstance(obj, dict) else "?"
        where = f"{path}:{lineno} (sequence {rid})"
        if not isinstance(obj, dict):
            raise RecordError(f"{where}: a line must be a JSON object")
        qas = obj.pop("qa", [])
        seq = Sequence.from_dict(obj, where=where)
        if source:
            seq.source = source
        _check_unique_turns(seq, where)
        out.sequences.append(seq)
        known_turns = {t.turn_id for t in seq.turns()}
        known_sessions = {s.session_id for s in seq.sessions}
        if not isinstance(qas, list):
            raise RecordError(f"{where}: field 'qa' must be a list")
        for k, raw in enumerate(qas):
            qa = GenericQa.from_dict(raw, where=f"{where} qa[{k}]")
            item_id = f"{seq.sequence_id}/q{k:03d}"
            issues = [
                EvidenceIssue(
                    str(path), seq.sequence_id, item_id, qa.question, i, "turn id resolves to no turn"
                )
                for i in qa.evidence_turn_ids
                if i not in known_turns
            ] + [
                EvidenceIssue(
                    str(path), seq.sequence_id, item_id, qa.question, i, "session id resolves to no session"
                )
                for i in qa.evidence_session_ids
                if i not in known_sessions
            ]
            out.eval_items.append(
                EvalItem(
                    item_id=item_id,
                    benchmark=seq.source,
                    sequence_id=seq.sequence_id,
                    question=qa.question,
                    answer=qa.answer,
                    category=qa.category,
                    evidence_turn_ids=[i for i in qa.evidence_turn_ids if i in known_turns],
                    evidence_session_ids=[i for i in qa.evidence_session_ids if i in known_sessions],
                    is_trap=qa.is_trap,
                    question_date=qa.question_date,
                    evidence_issues=[i.short() for i in issues],
                )
            )
            out.issues += issues
    _log_issues(path, out.issues)
    return out


LOADERS = {"locomo": load_locomo, "longmemeval": load_longmemeval, "jsonl": load_generic_jsonl}


def load_source(
    kind: str, path: str | Path, name: str | None = None, allow_session_gaps: bool = False
) -> LoadResult:
    if kind not in LOADERS:
        raise ValueError(f"unknown source kind {kind!r} (known: {sorted(LOADERS)})")
    args: list[Any] = [path] + ([name] if name else [])
    if kind == "locomo":
        return load_locomo(*args, allow_session_gaps=allow_session_gaps)
    return LOADERS[kind](*args)
