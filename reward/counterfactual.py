"""Counterfactual ORM (beyond the report): the credit a chunk gets is the ORM answers it changes.

The report attributes ORM evidentially: a chunk is credited for the gold facts it introduced, whether
or not its writes are what let the reader answer. Here each window's ORM questions are read again
once per chunk, on the final bank *with that chunk's writes left out*, and orm[t] is the drop in the
share of gold facts recovered (`reward.terms.orm_counterfactual`).

The leave-out is done at retrieval, so it works through any harness's own search, with no bank
rebuilt: the final bank is searched once, deeper than `search_k`, and for chunk t the records it
wrote are taken out of each result list before the top `search_k` reach the reader:
- a record chunk t added (absent from the bank before it) is dropped, even if a later chunk updated it;
- a record chunk t updated reverts to its text before chunk t, if no later chunk changed it again
  (a later write superseded chunk t's, so leaving chunk t out changes nothing there).
What this does not undo: a record chunk t deleted is not restored (the bank no longer holds it, so its
search cannot rank it), and the later chunks' writes are not re-run without chunk t (that would need
the policy again). A chunk whose left-out view equals the full one costs no reader call: its answers
are the full bank's.

Cost: at most C extra reader calls per ORM question and rollout; `reward/counterfactual_reader_calls`
counts them and `reward/counterfactual_seconds` their time (docs/reward.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

ADDED = None  # the "text before chunk t" of a record chunk t added


def chunk_writes(before: Sequence[Any], after: Sequence[Any]) -> dict[str, str | None]:
    """The records one chunk wrote: id -> its text before the chunk (ADDED for a record it added).
    `before` / `after`: the bank's entries (harnesses.base.MemoryEntry) around the chunk."""
    old = {e.id: e.text for e in before}
    return {e.id: old.get(e.id, ADDED) for e in after if e.id not in old or old[e.id] != e.text}


def left_out(
    results: Sequence[Any], writes: dict[str, str | None], after_text: dict[str, str], k: int
) -> list[Any]:
    """One search result list (deeper than k) as it reads without one chunk's writes: the top k.
    `after_text`: id -> the record's text right after that chunk (to see whether a later write
    superseded it)."""
    out = []
    for e in results:
        if e.id in writes:
            before = writes[e.id]
            if before is ADDED:
                continue  # the chunk added it: without the chunk it does not exist
            if e.text == after_text.get(e.id):
                e = dataclasses.replace(e, text=before)  # the chunk's update is the one still standing
        out.append(e)
        if len(out) == k:
            break
    return out


def same_view(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two result lists read the same to the reader (ids and texts, in order)."""
    return [(e.id, e.text) for e in a] == [(e.id, e.text) for e in b]
