"""Shared fixtures of the data-pipeline tests (CPU, small, offline)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

SHARED_DATA = Path(os.environ.get("HYMEM_SHARED_DATA", "/work/shared/data"))
LOCOMO = SHARED_DATA / "locomo" / "locomo_sample.json"
LONGMEMEVAL = SHARED_DATA / "longmemeval" / "longmemeval_s_sample.json"


@pytest.fixture
def locomo_path() -> Path:
    if not LOCOMO.exists():
        pytest.skip(f"shared sample data missing: {LOCOMO}")
    return LOCOMO


@pytest.fixture
def longmemeval_path() -> Path:
    if not LONGMEMEVAL.exists():
        pytest.skip(f"shared sample data missing: {LONGMEMEVAL}")
    return LONGMEMEVAL


os.environ["NO_PROXY"] = "127.0.0.1,localhost," + os.environ.get("NO_PROXY", "")
