"""Canonical, versioned data types of the reward data.

One definition of each record the pipeline stores and the trainer / reward / evaluation code reads:

    Sequence(sessions[Session(turns[Turn])])  raw long interaction, one per benchmark sample
    Chunk(sequence_id, index, turns, date)     the unit the memory writer consumes in one write
    Window(sequence_id, chunk_indices <= 5)    the RL unit: 8 rollouts write all its chunks
    Fact(chunk_index)                          atomic fact, attributed to the chunk that introduced it
    Probe(chunk_index, kind, is_trap)          PRM item of one chunk (recall probe or trap)
    OrmQuestion(window, gold_facts[source_chunk])  cross-chunk question for the outcome reward
    EvalItem                                   a benchmark's own QA (LoCoMo, LongMemEval, ...)

Indices: every `chunk_index` / `source_chunk` / `evidence_chunks` value is the chunk's index within its
*sequence* (Chunk.index), never a position inside a window. A gold fact whose source chunk lies in an
earlier window credits no chunk of the current window (report section "attributed memory RL").

Gold facts (`OrmQuestion.gold_facts`, `Fact` rows) are judge-only: `public_view()` strips them for
anything the bank, the retrieval query or the answer model sees.

Every record has `to_dict()` and a strict `from_dict(d, where=...)`: a missing, unknown or mistyped
field raises RecordError naming `where` (file and record id) and the dotted field. Stored tables are
Hugging Face datasets with the explicit `FEATURES[table]` of data_pipeline/store.py (kept there so that
importing these types does not import `datasets`: every RL rollout actor imports them, and `datasets`
with pandas and pyarrow was most of its start-up). Bump SCHEMA_VERSION on any change to a stored field.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

SCHEMA_VERSION = 1
MAX_WINDOW_CHUNKS = 5  # report: RL windows hold at most 5 consecutive chunks of one sequence
NO_SUCH_RECORD = "no such record"  # reference answer of every trap probe (report, Should-not-store)

T = TypeVar("T")


class RecordError(ValueError):
    """A stored or loaded record that does not match the schema; the message names where and the field."""


class ProbeKind(enum.StrEnum):
    """The report's six PRM probe types."""

    SPECIFICITY = "specificity"
    SEMANTIC_PRECISION = "semantic_precision"
    PLAIN_RECALL = "plain_recall"
    MINOR_DIMENSION = "minor_dimension"
    TRANSITION = "transition"  # an update: the old state was replaced by a new one
    SHOULD_NOT_STORE = "should_not_store"  # trap: chit-chat / transient content a good bank omits


# ---------------------------------------------------------------------------------------------------
# strict (de)serialisation shared by all records


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp)


def _convert(value: Any, tp: Any, where: str, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(value, args[0], where, path)
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{where}: field '{path}' must be a list, got {type(value).__name__}")
        (inner,) = typing.get_args(tp)
        return [_convert(v, inner, where, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: field '{path}' must be a mapping, got {type(value).__name__}")
        return {str(k): _convert(v, typing.get_args(tp)[1], where, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _from_dict(tp, value, where, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(m.value for m in tp)
            raise RecordError(f"{where}: field '{path}' = {value!r} is not one of: {allowed}") from None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RecordError(f"{where}: field '{path}' must be a number, got {type(value).__name__}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(f"{where}: field '{path}' must be an int, got {type(value).__name__}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise RecordError(f"{where}: field '{path}' must be {_type_name(tp)}, got {type(value).__name__}")
        return value
    if tp is Any:
        return value
    raise TypeError(f"schema: unsupported field type {tp!r} at {path}")


def _from_dict(cls: type[T], d: Any, where: str, prefix: str = "") -> T:
    if not isinstance(d, dict):
        raise RecordError(f"{where}: {prefix or cls.__name__} must be a mapping, got {type(d).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise RecordError(f"{where}: unknown field(s) {unknown} in {cls.__name__} at '{prefix or '.'}'")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        path = f"{prefix}.{name}" if prefix else name
        if name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecordError(f"{where}: missing field '{path}' ({cls.__name__})")
            continue
        kwargs[name] = _convert(d[name], hints[name], where, path)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        if isinstance(e, RecordError):
            raise
        raise RecordError(f"{where}: {cls.__name__} at '{prefix or '.'}': {e}") from None


def _to_plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


class Record:
    """Mixin: `to_dict()` (plain JSON-able dict, enums as their values) and strict `from_dict()`."""

    TABLE: ClassVar[str] = ""  # name of the stored table ("" = only nested inside another record)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    @classmethod
    def from_dict(cls: type[T], d: Any, where: str = "<record>") -> T:
        return _from_dict(cls, d, where)


# ---------------------------------------------------------------------------------------------------
# raw interaction


@dataclass
class Turn(Record):
    turn_id: str  # unique within the sequence: LoCoMo "D<session>:<turn>", LongMemEval "<session_id>:<i>"
    speaker: str  # speaker name or chat role ("user" / "assistant")
    text: str  # utterance text as the benchmark wrote it
    image_caption: str = ""  # LoCoMo shared-image caption (`blip_caption`); "" when none
    has_answer: bool = False  # LongMemEval's turn-level evidence flag (evaluation only, never shown)


@dataclass
class Session(Record):
    session_id: str  # unique within the sequence ("session_3" / LongMemEval haystack session id)
    date: str  # session timestamp as written by the source ("" when the source has none)
    turns: list[Turn]  # in conversation order


@dataclass
class Sequence(Record):
    TABLE: ClassVar[str] = "sequences"
    sequence_id: str  # unique across a built dataset ("locomo/conv-26", "lme_s/e47becba", "synth/000")
    source: str  # benchmark / generator the sequence came from ("locomo", "longmemeval_s", "synthetic")
    sessions: list[Session]  # in time order
    speakers: list[str] = field(default_factory=list)  # participant names when the source gives them

    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s.turns]


@dataclass
class Chunk(Record):
    TABLE: ClassVar[str] = "chunks"
    sequence_id: str  # owning sequence
    index: int  # position of the chunk within its sequence (0-based), the `t` of the report's rewards
    turns: list[Turn]  # the turns the writer sees in this write, in order
    date: str  # date of the (first) session the chunk's turns belong to
    session_ids: list[str] = field(default_factory=list)  # sessions the chunk's turns come from
    num_tokens: int = 0  # tokens of the rendered chunk under the chunking tokenizer (0 = not measured)
    # turn offset where each of `session_ids` starts and its date: a chunk spanning sessions renders
    # every session's date (temporal questions need it); empty = one session dated `date`
    session_starts: list[int] = field(default_factory=list)
    session_dates: list[str] = field(default_factory=list)

    @property
    def chunk_id(self) -> str:
        return chunk_id(self.sequence_id, self.index)

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"chunk {self.sequence_id}: negative index {self.index}")


@dataclass
class Window(Record):
    TABLE: ClassVar[str] = "windows"
    sequence_id: str  # owning sequence
    index: int  # position of the window within its sequence (0-based); window i+1 inherits i's best bank
    chunk_indices: list[int]  # consecutive Chunk.index values, 1..MAX_WINDOW_CHUNKS of them

    @property
    def window_id(self) -> str:
        return window_id(self.sequence_id, self.index)

    def __post_init__(self) -> None:
        c = self.chunk_indices
        if not 1 <= len(c) <= MAX_WINDOW_CHUNKS:
            raise ValueError(f"window {self.window_id}: {len(c)} chunks (want 1..{MAX_WINDOW_CHUNKS})")
        if any(b != a + 1 for a, b in zip(c, c[1:], strict=False)):
            raise ValueError(f"window {self.window_id}: chunk indices {c} are not consecutive")


# ---------------------------------------------------------------------------------------------------
# reward annotations (PRM and ORM passes)


@dataclass
class Fact(Record):
    TABLE: ClassVar[str] = "facts"
    fact_id: str  # deterministic: "<sequence_id>/c<chunk>/f<k>"
    sequence_id: str  # owning sequence
    chunk_index: int  # chunk that introduced the fact (attribution for the ORM, report section 1)
    text: str  # one atomic fact ("Alice's dog is named Rex")
    turn_ids: list[str] = field(default_factory=list)  # turns stating it, when known
    supersedes: str = ""  # fact_id this fact replaces (an update / Transition); "" when none


@dataclass
class Probe(Record):
    TABLE: ClassVar[str] = "probes"
    probe_id: str  # deterministic: "<sequence_id>/c<chunk>/p<k>"
    sequence_id: str  # owning sequence
    chunk_index: int  # chunk t whose PRM term this probe scores
    kind: ProbeKind  # one of the report's six probe types
    question: str  # asked of the bank through the harness's retrieval + the fixed answer model
    reference: str  # expected answer; NO_SUCH_RECORD for traps
    rubric: str  # judge rubric: semantic conditions live here, never in string rules (silent failure string-rule-scoring)
    # trap: credit only when the answer says nothing was stored; kind is should_not_store for annotated
    # and synthetic traps, semantic_precision for LoCoMo's natural (adversarial) traps
    is_trap: bool = False
    fact_ids: list[str] = field(default_factory=list)  # facts the probe tests (judge-side only)

    def __post_init__(self) -> None:
        self.kind = ProbeKind(self.kind)
        if self.kind is ProbeKind.SHOULD_NOT_STORE and not self.is_trap:
            raise ValueError(f"probe {self.probe_id}: kind should_not_store must have is_trap=True")
        if self.is_trap and self.reference.strip().lower() != NO_SUCH_RECORD:
            raise ValueError(f"probe {self.probe_id}: trap reference must be {NO_SUCH_RECORD!r}")
        if self.chunk_index < 0:
            raise ValueError(f"probe {self.probe_id}: negative chunk_index")

    def public_view(self) -> dict[str, Any]:
        """What the retrieval query / answer model may see: the question only."""
        return {"probe_id": self.probe_id, "question": self.question}


@dataclass
class GoldFact(Record):
    fact: str  # atomic fact the answer must recover (judge-only)
    source_chunk: int  # Chunk.index that introduced it: the ORM credits orm[source_chunk]
    fact_id: str = ""  # Fact.fact_id when the fact is a stored Fact row
    answer: str = ""  # the fact's atomic answer span ("Rex") when known; lets exact-match score it


@dataclass
class OrmQuestion(Record):
    TABLE: ClassVar[str] = "orm_questions"
    question_id: str  # deterministic: "<sequence_id>/w<window>/q<k>"
    sequence_id: str  # owning sequence
    window_index: int  # Window.index the question is asked after
    question: str  # cross-chunk question (what the answer model sees)
    answer: str  # reference answer (judge-only)
    evidence_chunks: list[int]  # Chunk.index values holding the evidence
    gold_facts: list[GoldFact]  # judge-only; c_q[t] = share of facts with source_chunk t recovered
    rubric: str  # judge rubric

    def __post_init__(self) -> None:
        if not self.gold_facts:
            raise ValueError(f"orm question {self.question_id}: no gold facts")

    @property
    def window_id(self) -> str:
        return window_id(self.sequence_id, self.window_index)

    def gold_facts_by_chunk(self) -> dict[int, list[GoldFact]]:
        out: dict[int, list[GoldFact]] = {}
        for g in self.gold_facts:
            out.setdefault(g.source_chunk, []).append(g)
        return out

    def public_view(self) -> dict[str, Any]:
        """What the retrieval query / answer model may see: no answer, no gold facts, no evidence."""
        return {"question_id": self.question_id, "question": self.question}


@dataclass
class EvalItem(Record):
    TABLE: ClassVar[str] = "eval_items"
    item_id: str  # deterministic: "<sequence_id>/q<k>" (k = position in the source's QA list)
    benchmark: str  # "locomo", "longmemeval_s", ...
    sequence_id: str  # sequence the bank is built from
    question: str  # as the benchmark wrote it
    answer: str  # gold answer as text ("" for an adversarial item without one)
    category: str  # source category label, unmapped ("1".."5" for LoCoMo, question_type for LongMemEval)
    evidence_turn_ids: list[str]  # evidence turns that resolve to a Turn of the sequence
    evidence_session_ids: list[str] = field(default_factory=list)  # evidence sessions (LongMemEval)
    evidence_chunks: list[int] = field(default_factory=list)  # filled after chunking
    is_trap: bool = False  # adversarial / unanswerable item (LoCoMo category 5): the bank holds no answer
    adversarial_answer: str = ""  # LoCoMo category 5: the wrong answer the question baits
    question_date: str = ""  # "asked on" timestamp when the source gives one
    evidence_issues: list[str] = field(default_factory=list)  # malformed / unresolved ids, reported

    def public_view(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "question": self.question, "question_date": self.question_date}


# ---------------------------------------------------------------------------------------------------
# deterministic ids


def chunk_id(sequence_id: str, index: int) -> str:
    return f"{sequence_id}/c{index:04d}"


def window_id(sequence_id: str, index: int) -> str:
    return f"{sequence_id}/w{index:04d}"


def fact_id(sequence_id: str, chunk_index: int, k: int) -> str:
    return f"{chunk_id(sequence_id, chunk_index)}/f{k:03d}"


def probe_id(sequence_id: str, chunk_index: int, k: int) -> str:
    return f"{chunk_id(sequence_id, chunk_index)}/p{k:03d}"


def question_id(sequence_id: str, window_index: int, k: int) -> str:
    return f"{window_id(sequence_id, window_index)}/q{k:03d}"


RECORD_TYPES: dict[str, type[Record]] = {
    "sequences": Sequence,
    "chunks": Chunk,
    "windows": Window,
    "facts": Fact,
    "probes": Probe,
    "orm_questions": OrmQuestion,
    "eval_items": EvalItem,
}


@dataclass
class Manifest(Record):
    """`manifest.json` of a built dataset directory: what it is and how it was made."""

    name: str  # dataset name ("demo_synth", "locomo_eval", ...)
    sources: list[str]  # benchmarks / generators it was built from
    schema_version: int = SCHEMA_VERSION  # SCHEMA_VERSION the tables were written with
    answers_atomic: bool = False  # every reference is one atomic span: exact-match scoring is allowed
    counts: dict[str, int] = field(default_factory=dict)  # rows per stored table
    eval_subsample: dict[str, Any] = field(default_factory=dict)  # seeded 20% choice: seed, fraction, ids
    config: dict[str, Any] = field(default_factory=dict)  # resolved build config that produced it
