"""Picklable harness factories for processes that only read banks (reward actors, lineage checks)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from harnesses.registry import HarnessConfig, make_harness


class BankReaderFactory:
    """`factory()` -> a harness of one configuration with no LLM endpoint (open / search / read only).

    Shipped to Ray actors by value; each call gets its own sandbox directory, so two actors never
    share a sandbox's files.
    """

    def __init__(self, cfg: HarnessConfig, sandbox_root: str | os.PathLike[str]):
        self.cfg = cfg
        self.sandbox_root = str(sandbox_root)

    def __call__(self):
        sid = f"reader-{uuid.uuid4().hex[:8]}"
        root = Path(self.sandbox_root) / sid
        root.mkdir(parents=True, exist_ok=True)
        return make_harness(self.cfg, None, None, sandbox_root=root, sandbox_id=sid)
