import os

import pytest

from harnesses.base import Endpoint
from harnesses.testing import StandInServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MEM0_TELEMETRY", "False")


@pytest.fixture
def server():
    with StandInServer(allowed_keys={"traj-A", "traj-B"}) as srv:
        yield srv


@pytest.fixture
def llm(server):
    return Endpoint(base_url=server.base_url, api_key="traj-A", model="policy", timeout_s=10.0)


@pytest.fixture
def embedder(server):
    return Endpoint(base_url=server.base_url, api_key="traj-A", model="minilm", timeout_s=10.0)


CHUNK = [
    {"role": "user", "content": "I moved to Lisbon in March and I adopted a cat named Pixel."},
    {"role": "assistant", "content": "Congratulations on the move and on Pixel!"},
]
