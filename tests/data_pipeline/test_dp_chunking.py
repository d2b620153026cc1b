"""Chunker and window builder: property-based (hypothesis) plus a real `tokenizers` tokenizer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_pipeline.chunking import (
    ChunkingConfig,
    WhitespaceTokenizer,
    _count,
    build_windows,
    chunk_sequence,
    render_chunk,
    render_header,
    render_turn,
    select_subsample,
)
from data_pipeline.schema import MAX_WINDOW_CHUNKS, Chunk, Sequence, Session, Turn

WORDS = st.sampled_from(["a", "bb", "dog", "Rex", "moved", "Lisbon", "hi", "ok", "the"])


@st.composite
def sequences(draw):
    num_sessions = draw(st.integers(1, 6))
    sessions = []
    n = 0
    for s in range(num_sessions):
        turns = []
        for _ in range(draw(st.integers(0, 6))):
            text = " ".join(draw(st.lists(WORDS, min_size=1, max_size=12)))
            turns.append(Turn(f"t{n}", draw(st.sampled_from(["A", "B"])), text))
            n += 1
        sessions.append(Session(f"s{s}", f"2023-01-{s + 1:02d}", turns))
    return Sequence("seq", "test", sessions)


CONFIGS = st.one_of(
    st.just(ChunkingConfig(mode="session")),
    st.builds(
        ChunkingConfig, mode=st.sampled_from(["tokens", "session_tokens"]), max_tokens=st.integers(3, 40)
    ),
)


def _session_of(seq):
    return {t.turn_id: s.session_id for s in seq.sessions for t in s.turns}


@settings(max_examples=150, deadline=None)
@given(seq=sequences(), cfg=CONFIGS)
def test_chunker_properties(seq, cfg):
    tok = WhitespaceTokenizer()
    chunks = chunk_sequence(seq, cfg, tok)
    # nothing lost, duplicated or reordered; indices 0..n-1; deterministic
    assert [t.turn_id for c in chunks for t in c.turns] == [t.turn_id for t in seq.turns()]
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert all(c.turns for c in chunks)
    assert chunk_sequence(seq, cfg, tok) == chunks
    sess = _session_of(seq)
    for c in chunks:
        assert c.session_ids == list(dict.fromkeys(sess[t.turn_id] for t in c.turns))
        assert c.num_tokens == len(tok.encode(render_chunk(c)))
        assert c.date == next(s.date for s in seq.sessions if s.session_id == c.session_ids[0])
        # every session the chunk touches shows its own date, right before its first turn
        dates = {s.session_id: s.date for s in seq.sessions}
        assert c.session_dates == [dates[i] for i in c.session_ids]
        lines = render_chunk(c).split("\n")
        assert [ln for ln in lines if ln.startswith("[")] == [render_header(d) for d in c.session_dates]
        assert len(lines) == len(c.turns) + len(c.session_ids)
    if cfg.mode == "session":
        assert len(chunks) == sum(1 for s in seq.sessions if s.turns)
        assert all(len(c.session_ids) == 1 for c in chunks)
        return
    if cfg.mode == "session_tokens":
        assert all(len(c.session_ids) == 1 for c in chunks)
    for c, nxt in zip(chunks, [*chunks[1:], None], strict=False):
        # within budget unless one turn alone exceeds it (turns are never split)
        assert c.num_tokens <= cfg.max_tokens or len(c.turns) == 1
        # greedy: the next turn would not have fitted (unless a session boundary forced the cut)
        new_session = nxt is not None and nxt.session_ids[0] != c.session_ids[-1]
        if nxt is not None and not (cfg.mode == "session_tokens" and new_session):
            extra = _count(tok, render_turn(nxt.turns[0]))
            extra += _count(tok, render_header(nxt.session_dates[0])) if new_session else 0
            assert c.num_tokens + extra > cfg.max_tokens


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 23), min_size=1, max_size=4),
    k=st.integers(1, MAX_WINDOW_CHUNKS),
)
def test_window_builder_properties(lengths, k):
    chunks = [Chunk(f"seq{s}", i, [Turn("t", "A", "x")], "") for s, n in enumerate(lengths) for i in range(n)]
    windows = build_windows(chunks, k)
    assert build_windows(chunks, k) == windows
    for s, n in enumerate(lengths):
        ws = [w for w in windows if w.sequence_id == f"seq{s}"]
        assert [w.index for w in ws] == list(range(len(ws)))
        # windows tile the sequence in order, consecutive, at most k (<= 5) chunks, only the last short
        assert [i for w in ws for i in w.chunk_indices] == list(range(n))
        assert all(1 <= len(w.chunk_indices) <= k for w in ws)
        assert all(len(w.chunk_indices) == k for w in ws[:-1])
        assert len({w.window_id for w in ws}) == len(ws)


def test_window_builder_rejects_gaps_and_big_windows():
    chunks = [Chunk("s", i, [], "") for i in (0, 1, 3)]
    with pytest.raises(ValueError, match="not 0..2"):
        build_windows(chunks, 2)
    with pytest.raises(ValueError, match="not in 1..5"):
        build_windows(chunks[:2], 6)


def test_budget_with_a_real_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = ["my dog Rex chewed my shoes again", "I live in Lisbon near the river", "big news I moved"]
    raw = Tokenizer(models.BPE(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(text * 5, trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw)
    seq = Sequence(
        "s", "t", [Session("s1", "2023-01-01", [Turn(f"t{i}", "A", text[i % 3]) for i in range(9)])]
    )
    chunks = chunk_sequence(seq, ChunkingConfig(mode="tokens", max_tokens=30), tok)
    assert len(chunks) > 1
    for c in chunks:
        assert c.num_tokens == len(tok.encode(render_chunk(c))) <= 30
    # the raw tokenizers.Tokenizer (encode -> Encoding) counts the same
    assert chunk_sequence(seq, ChunkingConfig(mode="tokens", max_tokens=30), raw) == chunks


def test_header_counts_in_budget():
    seq = Sequence("s", "t", [Session("s1", "2023-01-01", [Turn("a", "A", "one two"), Turn("b", "A", "x")])])
    # header "[2023-01-01]" = 1 word, turn a "A: one two" = 3, turn b "A: x" = 2: budget 5 forces a cut
    assert len(render_header("2023-01-01").split()) == 1
    assert [len(c.turns) for c in chunk_sequence(seq, ChunkingConfig(mode="tokens", max_tokens=5))] == [1, 1]
    assert [len(c.turns) for c in chunk_sequence(seq, ChunkingConfig(mode="tokens", max_tokens=6))] == [2]


def test_config_validation():
    with pytest.raises(ValueError, match="max_tokens"):
        chunk_sequence(Sequence("s", "t", []), ChunkingConfig(mode="tokens"))
    with pytest.raises(ValueError, match="mode"):
        ChunkingConfig(mode="turns").validate()


def test_subsample_is_seeded_and_recorded():
    ids = [f"q{i}" for i in range(50)]
    a = select_subsample(ids, 0.2, seed=7)
    assert len(a) == 10 and set(a) <= set(ids) and a == sorted(a)
    assert select_subsample(list(reversed(ids)), 0.2, seed=7) == a  # input order does not matter
    assert select_subsample(ids, 0.2, seed=8) != a
    assert select_subsample(ids[:3], 0.2, seed=0) and len(select_subsample(ids[:3], 0.2, seed=0)) == 1
