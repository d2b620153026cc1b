"""Shared fixtures of the data-pipeline tests (CPU, small, offline)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

SAMPLE_DATA = Path(__file__).resolve().parents[1] / "fixtures" / "sample_data"  # bundled slices
LOCOMO = SAMPLE_DATA / "locomo" / "locomo_sample.json"
LONGMEMEVAL = SAMPLE_DATA / "longmemeval" / "longmemeval_s_sample.json"


@pytest.fixture
def locomo_path() -> Path:
    return LOCOMO


@pytest.fixture
def longmemeval_path() -> Path:
    return LONGMEMEVAL


os.environ["NO_PROXY"] = "127.0.0.1,localhost," + os.environ.get("NO_PROXY", "")
