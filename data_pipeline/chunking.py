"""Chunks, windows and the fixed evaluation subsample.

A chunk is what the memory writer consumes in one write; its index is the `t` of every per-chunk
reward. Chunking modes:
- "session":        one chunk per session (LoCoMo-style harnesses write once per session);
- "tokens":         greedy packing of whole turns up to `max_tokens`, crossing session boundaries;
- "session_tokens": a session is split into token-budget chunks; a chunk never spans two sessions.
Turns are never split: a single turn longer than the budget becomes its own chunk (logged), since a
half-turn would attribute facts to a chunk that does not contain them.

The budget is counted on the rendered chunk (`render_chunk`: a date header plus one line per turn,
joined by newlines) with any tokenizer offering `encode(text) -> list[int]`. Packing estimates a
chunk as the sum of its lines plus one newline per line after the first (each line is tokenized once,
so chunking stays linear in the sequence length), then counts the rendered chunk exactly once and
gives back trailing turns while it is over the budget (a BPE can merge across a line break), so no
chunk of two or more turns exceeds `max_tokens`.

Windows are consecutive, non-overlapping runs of at most 5 chunks (report: the best rollout's final
bank of window i is the parent bank of window i+1, so windows must tile the sequence in order).
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from data_pipeline.schema import MAX_WINDOW_CHUNKS, Chunk, EvalItem, Fact, Sequence, Turn, Window, fact_id

log = logging.getLogger(__name__)
CHUNK_MODES = ("session", "tokens", "session_tokens")


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


class WhitespaceTokenizer:
    """Counts whitespace-separated words; the default when no model tokenizer is configured."""

    def encode(self, text: str) -> list[int]:
        return [len(w) for w in text.split()]


@dataclass
class ChunkingConfig:
    mode: str = "session"  # "session" | "tokens" | "session_tokens"
    max_tokens: int = 0  # token budget of one rendered chunk (token modes only; 0 = unset)
    num_chunks_per_window: int = MAX_WINDOW_CHUNKS  # chunks per RL window, at most 5 (report)
    tokenizer_path: str = ""  # local HF tokenizer dir for budgets; "" = whitespace words

    def validate(self) -> None:
        if self.mode not in CHUNK_MODES:
            raise ValueError(f"chunking.mode={self.mode!r} not in {CHUNK_MODES}")
        if self.mode != "session" and self.max_tokens <= 0:
            raise ValueError(f"chunking.max_tokens must be > 0 for mode {self.mode!r}")
        if not 1 <= self.num_chunks_per_window <= MAX_WINDOW_CHUNKS:
            raise ValueError(f"chunking.num_chunks_per_window must be in 1..{MAX_WINDOW_CHUNKS}")


def render_turn(turn: Turn) -> str:
    """One turn as the writer sees it. Never includes `has_answer` (evaluation-only evidence flag)."""
    line = f"{turn.speaker}: {turn.text}"
    if turn.image_caption:
        line += f" [shares an image: {turn.image_caption}]"
    return line


# session-date layouts of the sources, as they write them (LoCoMo, LongMemEval); ISO passes through
_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%Y/%m/%d (%a) %H:%M", "%Y/%m/%d")


def iso_date(date: str) -> str:
    """A chunk's date as ISO 8601 for the harnesses' `write_chunk` (hy-memory and EverOS parse it into a
    datetime). The data keeps the source's own text (what the writer reads); "" stays "" (undated)."""
    s = (date or "").strip()
    if not s:
        return ""
    try:
        dt.datetime.fromisoformat(s)
        return s  # already ISO: kept as written (the synthetic data's dates)
    except ValueError:
        pass
    for fmt in _DATE_FORMATS:
        try:
            return dt.datetime.strptime(s, fmt).isoformat()
        except ValueError:
            continue
    raise ValueError(f"session date {date!r}: not ISO 8601 and not a known source layout {_DATE_FORMATS}")


def render_header(date: str) -> str:
    return f"[{date}]" if date else "[no date]"


def render_chunk(chunk: Chunk) -> str:
    """The chunk as the writer sees it: a date header before the turns of each session."""
    headers = dict(zip(chunk.session_starts, chunk.session_dates, strict=True)) or {0: chunk.date}
    lines = []
    for i, t in enumerate(chunk.turns):
        if i in headers:
            lines.append(render_header(headers[i]))
        lines.append(render_turn(t))
    return "\n".join(lines) if lines else render_header(chunk.date)


def _count(tok: Tokenizer, text: str) -> int:
    ids = tok.encode(text)
    # a raw `tokenizers.Tokenizer` returns an Encoding; transformers tokenizers return list[int]
    return len(getattr(ids, "ids", ids))


def load_tokenizer(path: str) -> Tokenizer:
    """A local tokenizer directory (never the hub) or the whitespace counter when `path` is ""."""
    if not path:
        return WhitespaceTokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _make_chunk(seq_id: str, index: int, g: list[tuple[Turn, str, str]]) -> Chunk:
    starts = [j for j in range(len(g)) if j == 0 or g[j][1] != g[j - 1][1]]
    return Chunk(
        sequence_id=seq_id,
        index=index,
        turns=[t for t, _, _ in g],
        date=g[0][2],
        session_ids=[g[j][1] for j in starts],
        session_starts=starts,
        session_dates=[g[j][2] for j in starts],
    )


def _pack(
    seq_id: str, items: list[tuple[Turn, str, str]], budget: int, tok: Tokenizer
) -> list[list[tuple[Turn, str, str]]]:
    """Greedy packing of whole turns into groups whose rendered chunk fits `budget` tokens."""
    newline = _count(tok, "\n")
    line = [_count(tok, render_turn(t)) for t, _, _ in items]
    header = {d: _count(tok, render_header(d)) for _, _, d in items}
    groups = []
    i = 0
    while i < len(items):
        # a chunk opens with its date header; a later session inside it adds its own header line
        used = header[items[i][2]] + newline + line[i]
        j = i + 1
        while j < len(items):
            new_session = items[j][1] != items[j - 1][1]
            cost = newline + line[j] + (header[items[j][2]] + newline if new_session else 0)
            if used + cost > budget:
                break
            used += cost
            j += 1
        # the estimate can miss merges across line breaks: check the rendered chunk, give back turns
        while j - i > 1 and _count(tok, render_chunk(_make_chunk(seq_id, 0, items[i:j]))) > budget:
            j -= 1
        if j - i == 1 and used > budget:
            t = items[i][0]
            log.warning(
                "%s: turn %s alone is %d tokens > budget %d; it becomes its own chunk",
                seq_id,
                t.turn_id,
                used,
                budget,
            )
        groups.append(items[i:j])
        i = j
    return groups


def chunk_sequence(seq: Sequence, cfg: ChunkingConfig, tokenizer: Tokenizer | None = None) -> list[Chunk]:
    """Split one sequence into chunks with deterministic indices 0..n-1."""
    cfg.validate()
    tok = tokenizer or WhitespaceTokenizer()
    # (turn, session_id, date) in order; packing groups these
    groups: list[list[tuple[Turn, str, str]]] = []
    if cfg.mode == "session":
        groups = [[(t, s.session_id, s.date) for t in s.turns] for s in seq.sessions if s.turns]
    else:
        runs = [[(t, s.session_id, s.date) for t in s.turns] for s in seq.sessions]
        if cfg.mode == "tokens":  # packing crosses session boundaries
            runs = [[x for r in runs for x in r]]
        groups = [g for r in runs if r for g in _pack(seq.sequence_id, r, cfg.max_tokens, tok)]
    chunks = []
    for i, g in enumerate(groups):
        c = _make_chunk(seq.sequence_id, i, g)
        c.num_tokens = _count(tok, render_chunk(c))
        chunks.append(c)
    return chunks


def build_windows(chunks: list[Chunk], num_chunks_per_window: int = MAX_WINDOW_CHUNKS) -> list[Window]:
    """Consecutive, non-overlapping windows of at most `num_chunks_per_window` chunks, per sequence."""
    if not 1 <= num_chunks_per_window <= MAX_WINDOW_CHUNKS:
        raise ValueError(f"num_chunks_per_window={num_chunks_per_window} not in 1..{MAX_WINDOW_CHUNKS}")
    by_seq: dict[str, list[Chunk]] = {}
    for c in chunks:
        by_seq.setdefault(c.sequence_id, []).append(c)
    windows = []
    for seq_id, cs in by_seq.items():
        idx = sorted(c.index for c in cs)
        if idx != list(range(len(idx))):
            raise ValueError(f"sequence {seq_id}: chunk indices {idx[:10]}... are not 0..{len(idx) - 1}")
        for w, start in enumerate(range(0, len(idx), num_chunks_per_window)):
            windows.append(Window(seq_id, w, idx[start : start + num_chunks_per_window]))
    return windows


def turn_to_chunk(chunks: Iterable[Chunk]) -> dict[tuple[str, str], int]:
    return {(c.sequence_id, t.turn_id): c.index for c in chunks for t in c.turns}


def attribute_eval_items(items: list[EvalItem], chunks: list[Chunk]) -> None:
    """Fill `evidence_chunks` from evidence turn ids (and sessions when no turn is known)."""
    by_turn = turn_to_chunk(chunks)
    by_session: dict[tuple[str, str], set[int]] = {}
    for c in chunks:
        for s in c.session_ids:
            by_session.setdefault((c.sequence_id, s), set()).add(c.index)
    for it in items:
        found = {by_turn[(it.sequence_id, t)] for t in it.evidence_turn_ids if (it.sequence_id, t) in by_turn}
        if not found:
            for s in it.evidence_session_ids:
                found |= by_session.get((it.sequence_id, s), set())
        it.evidence_chunks = sorted(found)


def attribute_seed_facts(seed_facts: Iterable[Any], chunks: list[Chunk]) -> list[Fact]:
    """Seed facts (LoCoMo observations) -> Fact rows credited to the chunk of their latest turn."""
    by_turn = turn_to_chunk(chunks)
    counters: dict[tuple[str, int], int] = {}
    facts = []
    for sf in seed_facts:
        idx = [by_turn[(sf.sequence_id, t)] for t in sf.turn_ids if (sf.sequence_id, t) in by_turn]
        if not idx:
            continue
        c = max(idx)  # a fact is only complete once its last supporting turn has been written
        k = counters.get((sf.sequence_id, c), 0)
        counters[(sf.sequence_id, c)] = k + 1
        facts.append(Fact(fact_id(sf.sequence_id, c, k), sf.sequence_id, c, sf.text, list(sf.turn_ids)))
    return facts


def select_subsample(ids: Iterable[str], fraction: float, seed: int) -> list[str]:
    """The fixed evaluation subsample: a seeded choice of round(fraction * n) ids (>= 1 if any)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"subsample fraction {fraction} not in (0, 1]")
    pool = sorted(set(ids))
    if not pool:
        return []
    k = max(1, round(fraction * len(pool)))
    return sorted(random.Random(seed).sample(pool, k))
