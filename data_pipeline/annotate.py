"""The two annotation passes through an annotator LLM behind any OpenAI-compatible endpoint.

PRM pass, per chunk t (in order, because it needs earlier output): the annotator sees chunk t and the
facts already extracted from chunks t-1 and t-2, and writes atomic facts (new ones; an update names
the earlier fact it supersedes), recall probes of the report's five recall kinds and Should-not-store
traps, each with a rubric.
ORM pass, per window: it sees the earlier facts (chunks before the window) and the window's facts and
writes cross-chunk questions naming their gold facts by id. Attribution is never the annotator's
word: a gold fact's `source_chunk` is the chunk the cited Fact was extracted from (report section 1).

Every answer is validated strictly (pydantic models with extra="forbid", plus context checks: cited
ids exist, turn ids belong to the chunk). An invalid answer is retried with the error appended, at
most `num_retries` times; what still fails is written to `failures.jsonl` (call key, pass, sequence,
chunk or window, every error) and the run continues without that chunk's / window's annotations.
Transport errors (server down, HTTP 5xx) are recorded as `platform` failures and never cached, so a
rerun retries them. Finished calls are appended to `calls.jsonl` (one fsynced line per call, keyed
by a hash of model + prompt + versions): a rerun, or a resumed run after a crash, does not re-pay them.

Real path (vLLM-served annotator), see docs/data.md:
    vllm serve /models/annotator --port 8000 --served-model-name annotator
    python -m data_pipeline.build data=locomo_sample annotator.base_url=http://HOST:8000/v1 \
        annotator.model=annotator
With `use_json_schema=True` the request carries `response_format={"type": "json_schema", ...}` so
vLLM's guided decoding emits schema-valid JSON; validation still runs on every answer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tqdm.auto import tqdm

from data_pipeline.chunking import render_chunk
from data_pipeline.schema import (
    NO_SUCH_RECORD,
    SCHEMA_VERSION,
    Chunk,
    Fact,
    GoldFact,
    OrmQuestion,
    Probe,
    ProbeKind,
    Window,
    fact_id,
    probe_id,
    question_id,
)
from data_pipeline.store import atomic_write_text

log = logging.getLogger(__name__)
PROMPT_VERSION = 1  # bump when a prompt changes: cached answers of the old prompt are not reused

RecallKind = Literal["specificity", "semantic_precision", "plain_recall", "minor_dimension", "transition"]


@dataclass
class AnnotatorConfig:
    base_url: str = ""  # OpenAI-compatible endpoint, e.g. http://host:8000/v1 ("" = no annotation pass)
    api_key: str = "EMPTY"  # bearer token for the endpoint (vLLM accepts any unless --api-key is set)
    model: str = ""  # served model name
    temperature: float = 0.0  # sampling temperature of the annotator
    max_tokens: int = 4096  # max completion tokens per call
    num_retries: int = 2  # re-asks after an invalid answer (the first attempt is not counted)
    num_transport_retries: int = 2  # HTTP-level retries inside the openai client (connection, 5xx)
    timeout_s: float = 300.0  # per-request timeout
    num_workers: int = 4  # sequences annotated concurrently (chunks of one sequence run in order)
    use_json_schema: bool = True  # send response_format json_schema (guided decoding on vLLM)
    num_prev_chunks: int = 2  # PRM context: facts of chunks t-1 .. t-num_prev_chunks (report: 2)
    num_earlier_facts: int = 200  # ORM context: most recent facts before the window, at most this many
    num_orm_questions: int = 3  # questions requested per window
    cache_dir: str = ""  # calls.jsonl + failures.jsonl live here ("" = <out_dir>/annotation_cache)
    progress: bool = True  # tqdm progress bar over calls
    # the build refuses to write a profile when fewer than this share of its annotation calls (PRM per
    # chunk, ORM per window) succeeded: a wrong context size or a server without JSON output fails them all
    min_success_rate: float = 0.9


# ---------------------------------------------------------------------------------------------------
# answer schemas (what the annotator must return)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PrmFactOut(_Strict):
    text: str = Field(min_length=1, description="one atomic fact, self-contained (names, not pronouns)")
    turn_ids: list[str] = Field(description="ids of the chunk's turns stating it")
    supersedes: str = Field("", description="fact_id of an earlier fact this one replaces, else empty")


class PrmProbeOut(_Strict):
    kind: RecallKind
    question: str = Field(min_length=1)
    reference: str = Field(min_length=1, description="short reference answer")
    rubric: str = Field(min_length=1, description="how a judge scores an answer, incl. partial credit")
    fact_indices: list[int] = Field(description="indices into this answer's `facts` the probe tests")


class PrmTrapOut(_Strict):
    question: str = Field(min_length=1, description="asks for something the bank should NOT have stored")
    rubric: str = Field(min_length=1)


class PrmAnswer(_Strict):
    facts: list[PrmFactOut]
    probes: list[PrmProbeOut]
    traps: list[PrmTrapOut]


class OrmQuestionOut(_Strict):
    question: str = Field(min_length=1)
    answer: str = Field(min_length=1)
    gold_fact_ids: list[str] = Field(min_length=1, description="fact_ids the answer needs")
    rubric: str = Field(min_length=1)


class OrmAnswer(_Strict):
    questions: list[OrmQuestionOut]


PRM_SYSTEM = f"""You annotate reward data for a memory-writing model (PRM pass, prompt v{PROMPT_VERSION}).
Input: one chunk of a conversation and the facts already extracted from the previous chunks.
Return ONE JSON object matching this JSON schema, nothing else:
{json.dumps(PrmAnswer.model_json_schema())}
Rules: facts are atomic, self-contained and new in this chunk; an update of an earlier fact sets
`supersedes` to that fact's id and gets a probe of kind "transition". Probes ask what a good memory
bank must answer after this chunk; kinds: specificity, semantic_precision, plain_recall,
minor_dimension, transition. Traps ask for things a good bank should not store (small talk,
transient states); their reference is always "{NO_SUCH_RECORD}". Rubrics state full / partial / zero credit."""

ORM_SYSTEM = f"""You annotate reward data for a memory-writing model (ORM pass, prompt v{PROMPT_VERSION}).
Input: facts from earlier chunks and the facts of the current window, each with its fact_id.
Return ONE JSON object matching this JSON schema, nothing else:
{json.dumps(OrmAnswer.model_json_schema())}
Rules: each question needs facts from at least two different chunks, at least one of them from the
current window; list every needed fact in `gold_fact_ids`; the rubric gives credit per fact recovered."""


class AnswerInvalid(ValueError):
    """The annotator's answer broke the schema or the context rules (retried, then recorded)."""


def parse_json_answer(content: str | None) -> Any:
    """The answer's JSON object; a single ```json fenced block is accepted, nothing else around it."""
    if content is None:
        raise AnswerInvalid("empty answer (no content)")
    text = content.strip()
    m = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, flags=re.S)
    if m:
        text = m.group(1)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise AnswerInvalid(f"not valid JSON: {e.msg} at char {e.pos}") from None


def _validate(model: type[BaseModel], obj: Any) -> Any:
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(map(str, err['loc'])) or '.'}: {err['msg']}" for err in e.errors()[:5])
        raise AnswerInvalid(f"schema: {msgs}") from None


def check_prm(ans: PrmAnswer, chunk: Chunk, prev_ids: set[str]) -> None:
    turn_ids = {t.turn_id for t in chunk.turns}
    for i, f in enumerate(ans.facts):
        bad = [t for t in f.turn_ids if t not in turn_ids]
        if bad:
            raise AnswerInvalid(f"facts[{i}].turn_ids {bad} are not turns of this chunk")
        if f.supersedes and f.supersedes not in prev_ids:
            raise AnswerInvalid(f"facts[{i}].supersedes {f.supersedes!r} is not a given earlier fact_id")
    for i, p in enumerate(ans.probes):
        bad = [k for k in p.fact_indices if not 0 <= k < len(ans.facts)]
        if bad:
            raise AnswerInvalid(f"probes[{i}].fact_indices {bad} out of range (0..{len(ans.facts) - 1})")


def check_orm(ans: OrmAnswer, known: dict[str, Fact], window: Window) -> None:
    for i, q in enumerate(ans.questions):
        bad = [f for f in q.gold_fact_ids if f not in known]
        if bad:
            raise AnswerInvalid(f"questions[{i}].gold_fact_ids {bad} are not given fact_ids")
        if not any(known[f].chunk_index in window.chunk_indices for f in q.gold_fact_ids):
            raise AnswerInvalid(f"questions[{i}] cites no fact of the current window")


# ---------------------------------------------------------------------------------------------------
# cached, validated calls


@dataclass
class Failure:
    key: str  # cache key of the call
    pass_name: str  # "prm" | "orm"
    sequence_id: str
    unit: str  # "chunk 3" / "window 1"
    kind: str  # "invalid_answer" (annotator output) | "platform" (transport / server)
    errors: list[str]  # one per attempt
    last_content: str = ""  # the last raw answer (truncated)


@dataclass
class AnnotationResult:
    facts: list[Fact] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    orm_questions: list[OrmQuestion] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    num_calls: int = 0  # calls that reached the endpoint (paid)
    num_cached: int = 0  # calls answered from the cache
    num_units: int = 0  # annotation units asked (one PRM call per chunk, one ORM call per window with facts)

    @property
    def success_rate(self) -> float:
        return 1.0 if not self.num_units else (self.num_units - len(self.failures)) / self.num_units


def failure_reason(f: Failure) -> str:
    """A failure's last error reduced to its kind: "platform: BadRequestError", "not valid JSON", "schema"."""
    last = re.sub(r"^attempt \d+: ", "", f.errors[-1] if f.errors else f.kind)
    parts = [p.strip() for p in last.split(":")]
    return ": ".join(parts[:2]) if parts[0] == "platform" else parts[0]


def failure_reasons(failures: list[Failure], top: int = 3) -> str:
    """The most common failure reasons, counted: "38x platform: BadRequestError, 9x not valid JSON"."""
    counts: dict[str, int] = {}
    for f in failures:
        counts[failure_reason(f)] = counts.get(failure_reason(f), 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{n}x {r}" for r, n in ranked[:top])
    rest = sum(n for _, n in ranked[top:])
    return text + (f", {rest}x other" if rest else "")


class CallCache:
    """Append-only JSONL of finished calls; a torn last line (crash mid-write) is ignored on load."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self.entries: dict[str, Any] = {}
        if path.exists():
            lines = path.read_text().splitlines()
            for n, line in enumerate(lines, start=1):
                try:
                    rec = json.loads(line)
                    self.entries[rec["key"]] = rec["answer"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    log.warning("%s:%d: unreadable cache line skipped (interrupted write?)", path, n)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            with open(path, "a") as f:  # close a torn last line so the next append starts clean
                f.write("\n")

    def get(self, key: str) -> Any | None:
        with self.lock:
            return self.entries.get(key)

    def put(self, key: str, pass_name: str, answer: Any) -> None:
        line = json.dumps({"key": key, "pass": pass_name, "answer": answer}, sort_keys=True)
        with self.lock:
            self.entries[key] = answer
            with open(self.path, "a") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())


def call_key(cfg: AnnotatorConfig, pass_name: str, messages: list[dict[str, str]]) -> str:
    blob = json.dumps(
        {"v": [SCHEMA_VERSION, PROMPT_VERSION], "pass": pass_name, "model": cfg.model, "messages": messages},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class Annotator:
    def __init__(self, cfg: AnnotatorConfig, cache_dir: str | Path, client: Any | None = None):
        if not cfg.base_url or not cfg.model:
            raise ValueError("annotator: base_url and model are required for an annotation pass")
        self.cfg = cfg
        if client is None:
            from openai import OpenAI

            client = OpenAI(
                base_url=cfg.base_url,
                api_key=cfg.api_key,
                timeout=cfg.timeout_s,
                max_retries=cfg.num_transport_retries,
            )
        self.client = client
        self.cache = CallCache(Path(cache_dir) / "calls.jsonl")
        self.cache_dir = Path(cache_dir)
        self.lock = threading.Lock()
        self.num_calls = 0
        self.num_cached = 0
        self.num_units = 0
        self.failures: list[Failure] = []

    def _response_format(self, name: str, model: type[BaseModel]) -> dict[str, Any] | None:
        if not self.cfg.use_json_schema:
            return None
        return {"type": "json_schema", "json_schema": {"name": name, "schema": model.model_json_schema()}}

    def call(
        self,
        pass_name: str,
        system: str,
        payload: dict[str, Any],
        model: type[BaseModel],
        check: Callable[[Any], None],
        sequence_id: str,
        unit: str,
    ) -> Any | None:
        """One validated call (cached). Returns the validated answer model or None (failure recorded)."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": json.dumps(payload)}]
        key = call_key(self.cfg, pass_name, messages)
        with self.lock:
            self.num_units += 1
        cached = self.cache.get(key)
        if cached is not None:
            with self.lock:
                self.num_cached += 1
            return model.model_validate(cached)
        errors: list[str] = []
        content = ""
        convo = list(messages)
        for attempt in range(1 + self.cfg.num_retries):
            try:
                kwargs: dict[str, Any] = {}
                rf = self._response_format(f"{pass_name}_answer", model)
                if rf is not None:
                    kwargs["response_format"] = rf
                with self.lock:
                    self.num_calls += 1
                resp = self.client.chat.completions.create(
                    model=self.cfg.model,
                    messages=convo,
                    temperature=self.cfg.temperature,
                    max_tokens=self.cfg.max_tokens,
                    **kwargs,
                )
                content = resp.choices[0].message.content or ""
            except Exception as e:  # the openai client already retried transport errors
                errors.append(f"attempt {attempt}: platform: {type(e).__name__}: {str(e)[:300]}")
                self._fail(key, pass_name, sequence_id, unit, "platform", errors, content)
                return None
            try:
                ans = _validate(model, parse_json_answer(content))
                check(ans)
            except AnswerInvalid as e:
                errors.append(f"attempt {attempt}: {e}")
                log.info("%s %s %s: invalid answer (%s), retrying", pass_name, sequence_id, unit, e)
                convo = [
                    *convo,
                    {"role": "assistant", "content": content},
                    {
                        "role": "user",
                        "content": f"Your answer is invalid: {e}. Return only the corrected JSON.",
                    },
                ]
                continue
            self.cache.put(key, pass_name, ans.model_dump())
            return ans
        self._fail(key, pass_name, sequence_id, unit, "invalid_answer", errors, content)
        return None

    def _fail(self, key, pass_name, sequence_id, unit, kind, errors, content) -> None:
        f = Failure(key, pass_name, sequence_id, unit, kind, list(errors), (content or "")[:2000])
        log.warning(
            "%s %s %s failed (%s): %s", pass_name, sequence_id, unit, kind, errors[-1] if errors else ""
        )
        with self.lock:
            self.failures.append(f)

    # -------------------------------------------------------------------------------------------
    # the two passes for one sequence

    def annotate_sequence(
        self, chunks: list[Chunk], windows: list[Window], tick: Callable[[], None] = lambda: None
    ) -> tuple[list[Fact], list[Probe], list[OrmQuestion]]:
        chunks = sorted(chunks, key=lambda c: c.index)
        facts_by_chunk: dict[int, list[Fact]] = {}
        probes: list[Probe] = []
        for c in chunks:
            prev = [
                f
                for t in range(max(0, c.index - self.cfg.num_prev_chunks), c.index)
                for f in facts_by_chunk.get(t, [])
            ]
            prev_ids = {f.fact_id for f in prev}
            payload = {
                "sequence_id": c.sequence_id,
                "chunk_index": c.index,
                "chunk": render_chunk(c),
                "turn_ids": [t.turn_id for t in c.turns],
                "previous_facts": [
                    {"fact_id": f.fact_id, "chunk_index": f.chunk_index, "text": f.text} for f in prev
                ],
            }
            ans = self.call(
                "prm",
                PRM_SYSTEM,
                payload,
                PrmAnswer,
                lambda a, c=c, p=prev_ids: check_prm(a, c, p),
                c.sequence_id,
                f"chunk {c.index}",
            )
            tick()
            if ans is None:
                continue
            fs = [
                Fact(
                    fact_id(c.sequence_id, c.index, k),
                    c.sequence_id,
                    c.index,
                    f.text,
                    f.turn_ids,
                    f.supersedes,
                )
                for k, f in enumerate(ans.facts)
            ]
            facts_by_chunk[c.index] = fs
            k = 0
            for p in ans.probes:
                probes.append(
                    Probe(
                        probe_id(c.sequence_id, c.index, k),
                        c.sequence_id,
                        c.index,
                        ProbeKind(p.kind),
                        p.question,
                        p.reference,
                        p.rubric,
                        False,
                        [fs[i].fact_id for i in p.fact_indices],
                    )
                )
                k += 1
            for tr in ans.traps:
                probes.append(
                    Probe(
                        probe_id(c.sequence_id, c.index, k),
                        c.sequence_id,
                        c.index,
                        ProbeKind.SHOULD_NOT_STORE,
                        tr.question,
                        NO_SUCH_RECORD,
                        tr.rubric,
                        True,
                    )
                )
                k += 1

        all_facts = [f for c in chunks for f in facts_by_chunk.get(c.index, [])]
        questions: list[OrmQuestion] = []
        for w in sorted(windows, key=lambda w: w.index):
            earlier = [f for f in all_facts if f.chunk_index < w.chunk_indices[0]][
                -self.cfg.num_earlier_facts :
            ]
            current = [f for f in all_facts if f.chunk_index in w.chunk_indices]
            if not current:
                tick()
                continue  # nothing was introduced in this window: no question can credit its chunks
            known = {f.fact_id: f for f in earlier + current}
            payload = {
                "sequence_id": w.sequence_id,
                "window_index": w.index,
                "window_chunks": w.chunk_indices,
                "earlier_facts": [
                    {"fact_id": f.fact_id, "chunk_index": f.chunk_index, "text": f.text} for f in earlier
                ],
                "window_facts": [
                    {"fact_id": f.fact_id, "chunk_index": f.chunk_index, "text": f.text} for f in current
                ],
                "num_questions": self.cfg.num_orm_questions,
            }
            ans = self.call(
                "orm",
                ORM_SYSTEM,
                payload,
                OrmAnswer,
                lambda a, k=known, w=w: check_orm(a, k, w),
                w.sequence_id,
                f"window {w.index}",
            )
            tick()
            if ans is None:
                continue
            for k, q in enumerate(ans.questions):
                gold = [GoldFact(known[i].text, known[i].chunk_index, i) for i in q.gold_fact_ids]
                questions.append(
                    OrmQuestion(
                        question_id(w.sequence_id, w.index, k),
                        w.sequence_id,
                        w.index,
                        q.question,
                        q.answer,
                        sorted({g.source_chunk for g in gold}),
                        gold,
                        q.rubric,
                    )
                )
        return all_facts, probes, questions


def annotate(
    chunks: list[Chunk],
    windows: list[Window],
    cfg: AnnotatorConfig,
    cache_dir: str | Path,
    client: Any | None = None,
) -> AnnotationResult:
    """Run both passes over all sequences (sequences in parallel, chunks of one sequence in order)."""
    ann = Annotator(cfg, cache_dir, client)
    by_seq: dict[str, tuple[list[Chunk], list[Window]]] = {}
    for c in chunks:
        by_seq.setdefault(c.sequence_id, ([], []))[0].append(c)
    for w in windows:
        by_seq.setdefault(w.sequence_id, ([], []))[1].append(w)
    bar = tqdm(total=len(chunks) + len(windows), desc="annotate", unit="call", disable=not cfg.progress)
    bar_lock = threading.Lock()

    def tick() -> None:
        with bar_lock:
            bar.update(1)

    seq_ids = sorted(by_seq)
    with ThreadPoolExecutor(max_workers=max(1, cfg.num_workers)) as pool:
        parts = list(pool.map(lambda s: ann.annotate_sequence(*by_seq[s], tick=tick), seq_ids))
    bar.close()
    out = AnnotationResult(num_calls=ann.num_calls, num_cached=ann.num_cached, num_units=ann.num_units)
    for facts, probes, questions in parts:
        out.facts += facts
        out.probes += probes
        out.orm_questions += questions
    out.failures = sorted(ann.failures, key=lambda f: (f.sequence_id, f.pass_name, f.unit))
    failures_path = Path(cache_dir) / "failures.jsonl"
    atomic_write_text(
        failures_path, "".join(json.dumps(f.__dict__, sort_keys=True) + "\n" for f in out.failures)
    )
    log.info(
        "annotation: %d facts, %d probes, %d orm questions, %d failures (%s); %d calls paid, %d cached",
        len(out.facts),
        len(out.probes),
        len(out.orm_questions),
        len(out.failures),
        failures_path,
        out.num_calls,
        out.num_cached,
    )
    return out
