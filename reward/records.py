"""What the reward service receives from the rollout code, and the chunk-mapping checks.

The rollout code (a later issue) builds one `RolloutGroup` per window: the window, its probes and
ORM questions, and per rollout one `ChunkSnapshot` per chunk (a closed bank directory holding the
bank state right after that chunk's write, its size in tokens, and the write status).

Chunk indices are sequence-level `Chunk.index` values everywhere (data_pipeline.schema); the window
maps them to positions 0..C-1. A probe, gold fact or segment that maps to no chunk of the window
raises (silent failure chunk-unmapped): one score broadcast over unmapped items would train on the wrong chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from data_pipeline.schema import OrmQuestion, Probe, Window

CHUNK_STATUSES = ("ok", "policy_error", "platform_error")  # = harnesses.base.WriteStatus values


class ChunkMappingError(ValueError):
    """An item (probe, gold fact, segment, snapshot) with no chunk of the window (silent failure chunk-unmapped)."""


@dataclass
class ChunkSnapshot:
    """The bank right after one chunk's write in one rollout."""

    chunk_index: int  # sequence-level Chunk.index of the chunk just written
    bank_dir: str  # closed bank directory with the state after this chunk (opened by the adapter to search)
    size_tokens: int | None  # Harness.size_tokens after this chunk; None = could not be measured (platform)
    status: str  # write status of this chunk: ok | policy_error | platform_error


@dataclass
class RolloutRecord:
    """One finished rollout of the window."""

    trajectory_id: str  # the rollout's identity (gateway credential; segments carry it)
    chunks: list[ChunkSnapshot]  # one per window chunk, in window order
    status: str = "ok"  # rollout-level status (a crashed worker is platform_error even if chunks look ok)
    segment_chunks: list[int | None] = field(
        default_factory=list
    )  # Chunk.index of each LLM call (silent failure chunk-unmapped)

    @property
    def effective_status(self) -> str:
        """The worst of the rollout's and its chunks' statuses (platform > policy > ok)."""
        statuses = [self.status] + [c.status for c in self.chunks]
        for s in ("platform_error", "policy_error"):
            if s in statuses:
                return s
        return "ok"

    @property
    def final_bank_dir(self) -> str:
        return self.chunks[-1].bank_dir


@dataclass
class RolloutGroup:
    """All rollouts of one window, with the window's reward data."""

    window: Window  # the window the rollouts wrote
    harness: str  # harness name (selects the growth-penalty bounds)
    parent_size_tokens: int  # size in tokens of the parent bank every rollout started from
    rollouts: list[RolloutRecord]  # normally 8 (report)
    probes: list[Probe]  # PRM probes and traps of the window's chunks
    questions: list[OrmQuestion]  # ORM questions asked after the window
    # the closed parent bank every rollout forked (None: an empty bank); counterfactual ORM reads it to
    # see what the window's first chunk wrote
    parent_bank_dir: str | None = None

    @property
    def window_id(self) -> str:
        return self.window.window_id


def chunk_positions(window: Window) -> dict[int, int]:
    return {c: t for t, c in enumerate(window.chunk_indices)}


def probe_position(window: Window, probe: Probe) -> int:
    pos = chunk_positions(window)
    if probe.sequence_id != window.sequence_id or probe.chunk_index not in pos:
        raise ChunkMappingError(
            f"window {window.window_id}: probe {probe.probe_id} maps to chunk {probe.sequence_id}:"
            f"{probe.chunk_index}, not a chunk of this window {window.chunk_indices} (silent failure chunk-unmapped)"
        )
    return pos[probe.chunk_index]


def gold_fact_positions(window: Window, question: OrmQuestion) -> list[int | None]:
    """Window position of each gold fact's source chunk; None for facts from earlier windows."""
    if question.sequence_id != window.sequence_id or question.window_index != window.index:
        raise ChunkMappingError(
            f"window {window.window_id}: question {question.question_id} belongs to window "
            f"{question.window_id} (silent failure chunk-unmapped)"
        )
    pos = chunk_positions(window)
    first = window.chunk_indices[0]
    out: list[int | None] = []
    for f, g in enumerate(question.gold_facts):
        if g.source_chunk < first:
            out.append(None)  # introduced in an earlier window: credits no chunk of this one
        elif g.source_chunk in pos:
            out.append(pos[g.source_chunk])
        else:
            raise ChunkMappingError(
                f"window {window.window_id}: question {question.question_id} gold_facts[{f}].source_chunk="
                f"{g.source_chunk} lies after the window {window.chunk_indices} (silent failure chunk-unmapped)"
            )
    return out


def validate_group(group: RolloutGroup) -> None:
    """Every snapshot, probe, gold fact and recorded segment maps to a chunk of the window."""
    w = group.window
    if not group.rollouts:
        raise ValueError(f"window {w.window_id}: empty rollout group")
    for i, r in enumerate(group.rollouts):
        got = [c.chunk_index for c in r.chunks]
        if got != list(w.chunk_indices):
            raise ChunkMappingError(
                f"window {w.window_id}: rollout {i} ({r.trajectory_id}) has snapshots for chunks {got}, "
                f"want {w.chunk_indices} (silent failure chunk-unmapped)"
            )
        for c in r.chunks:
            if c.status not in CHUNK_STATUSES:
                raise ValueError(
                    f"window {w.window_id}: rollout {i} chunk {c.chunk_index} status {c.status!r}"
                )
        if r.status not in CHUNK_STATUSES:
            raise ValueError(f"window {w.window_id}: rollout {i} status {r.status!r}")
        for s, ci in enumerate(r.segment_chunks):
            if ci is None or ci not in w.chunk_indices:
                raise ChunkMappingError(
                    f"window {w.window_id}: rollout {i} ({r.trajectory_id}) segment {s} has chunk index "
                    f"{ci!r}, not a chunk of this window {w.chunk_indices} (silent failure chunk-unmapped)"
                )
    for p in group.probes:
        probe_position(w, p)
    for q in group.questions:
        gold_fact_positions(w, q)
