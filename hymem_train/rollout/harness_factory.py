"""Picklable harness factories for processes that only read banks (reward actors, lineage checks)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from harnesses.base import Endpoint
from harnesses.registry import HarnessConfig, make_harness


class BankReaderFactory:
    """`factory()` -> a harness of one configuration with no LLM endpoint (open / search / read only).

    Shipped to Ray actors by value. The sandbox root is the run directory: a reader must reach every
    rollout snapshot and promoted bank of the run (a rollout's own sandbox is confined to its rollout
    directory); each call gets its own sandbox id, so two readers never share a sandbox's files.
    """

    def __init__(
        self, cfg: HarnessConfig, sandbox_root: str | os.PathLike[str], embedder: Endpoint | None = None
    ):
        self.cfg = cfg
        self.sandbox_root = str(sandbox_root)
        self.embedder = embedder  # frameworks that search by vector (mem0, MemoryOS, ...) need one

    def __call__(self):
        sid = f"reader-{uuid.uuid4().hex[:8]}"
        root = Path(self.sandbox_root)
        root.mkdir(parents=True, exist_ok=True)
        return make_harness(self.cfg, None, self.embedder, sandbox_root=root, sandbox_id=sid)
