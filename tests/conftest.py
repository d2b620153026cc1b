import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# No hub, no telemetry, anywhere in the suite.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("MEM0_TELEMETRY", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# torch.distributed's rendezvous variables. A test that builds a Trainer in-process sets them (rank 0 of a
# world of 1, a port its TCPStore keeps); a later test's subprocess inherited that port and failed with
# EADDRINUSE (CI run of session 7). Restoring them after each test keeps one test's world out of the next.
_DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _isolate_distributed_env():
    before = {k: os.environ.get(k) for k in _DIST_ENV}
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def locomo_sample(tmp_path_factory):
    """The shared LoCoMo + LongMemEval-S slices built once (+exp=data_locomo_sample, a few seconds): the
    directory holding one dataset per chunking profile (mem0, hy_memory, memos)."""
    from data_pipeline.build import build, load_config

    os.environ["HYMEM_SAMPLE_DATA"] = str(REPO / "tests" / "fixtures" / "sample_data")  # wherever pytest runs
    out = tmp_path_factory.mktemp("locomo_sample")
    build(load_config(["+exp=data_locomo_sample", f"out_dir={out}"]))
    return out
