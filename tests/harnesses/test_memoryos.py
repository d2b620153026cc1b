"""MemoryOS 2.0.33 (`general_text` over local Qdrant) end to end in its own venv sandbox.

Skips (with the command that fixes it) when `.venvs/memoryos` is absent; CI creates it with
`scripts/make_harness_venvs.sh memoryos`.
"""

import json
import os
import signal

import pytest

from harnesses.base import Endpoint, WriteStatus
from harnesses.registry import REPO_ROOT, HarnessConfig, make_harness
from tests.doubles.openai_server import HttpFailure

from .conftest import CHUNK

MEMOS_PY = REPO_ROOT / ".venvs" / "memoryos" / "bin" / "python"
pytestmark = pytest.mark.skipif(
    not MEMOS_PY.exists(),
    reason=f"{MEMOS_PY} missing: run `scripts/make_harness_venvs.sh memoryos` (about 2 min)",
)


def _reply(*values):
    items = [
        {"key": f"k{i}", "memory_type": "UserMemory", "value": v, "tags": ["t"]} for i, v in enumerate(values)
    ]
    return json.dumps({"memory list": items, "summary": "s"})


@pytest.fixture
def memos(tmp_path, server):
    llm = Endpoint(server.base_url, "traj-A", "policy", timeout_s=10)
    cfg = HarnessConfig(framework="memoryos", scene="general_text", num_retries=0)
    h = make_harness(cfg, llm, llm, sandbox_root=tmp_path, sandbox_id="traj-A")
    yield h
    h.shutdown()


@pytest.mark.slow  # two sandbox starts of MemOS (imports transformers): 15-40 s on 2 shared cores
def test_scripted_policy_stores_reopens_forks(tmp_path, server, memos):
    server.set_replies([_reply("User has a cat named Pixel", "User moved to Lisbon in March 2023")])
    meta = memos.open(tmp_path / "bank", create=True)
    res = memos.write_chunk(CHUNK, "s1", "2023-03-05", chunk_index=1)
    assert (res.status, res.num_llm_calls, res.num_added) == (WriteStatus.OK, 1, 2), res
    assert sorted(e.text for e in memos.read_all()) == [
        "User has a cat named Pixel",
        "User moved to Lisbon in March 2023",
    ]
    assert memos.search("user has a cat named", 1)[0].text == "User has a cat named Pixel"
    req = server.chat_requests()[0]
    assert (
        req.headers["X-Hymem-Chunk-Index"] == "1" and "date 2023-03-05" in req.body["messages"][-1]["content"]
    )
    assert memos.call("stats")["num_foreign_calls"] == 0
    memos.close()
    memos.shutdown()  # silent failure bank-not-carried: a new process reads the bank back from disk
    kids = memos.fork(tmp_path / "bank", [tmp_path / "k0"])
    memos.open(tmp_path / "k0")
    assert (
        memos.count() == 2
        and memos.metadata().lineage == (meta.bank_id,)
        and kids[0].bank_id == memos.metadata().bank_id
    )


def test_malformed_output_gives_policy_errors(tmp_path, server, memos):
    memos.open(tmp_path / "bank", create=True)
    for reply in [
        "",
        "no json at all",
        '{"memories": []}',
        '{"memory list": [{"value": "x"}]}',
        '{"memory list": [],',
    ]:
        server.set_replies([reply])
        res = memos.write_chunk(CHUNK, "s1", "2023-03-05")
        assert res.status is WriteStatus.POLICY_ERROR and res.num_llm_calls == 1, (reply, res)
    assert memos.count() == 0
    server.set_replies([_reply()])
    assert memos.write_chunk(CHUNK, "s1", "2023-03-05").status is WriteStatus.OK


@pytest.mark.slow  # two sandbox starts of MemOS (imports transformers): 15-40 s on 2 shared cores
def test_platform_errors_and_kill_mid_write(tmp_path, server, memos):
    server.set_replies([_reply("User has a cat named Pixel")])
    memos.open(tmp_path / "bank", create=True)
    memos.write_chunk(CHUNK, "s1", "d")
    server.set_replies([HttpFailure(503)])
    assert memos.write_chunk(CHUNK, "s2", "d").status is WriteStatus.PLATFORM_ERROR

    def kill_then_answer(body):
        os.kill(memos.pid, signal.SIGKILL)
        return _reply("half written")

    server.set_replies(kill_then_answer)
    res = memos.write_chunk(CHUNK, "s3", "d")
    assert res.status is WriteStatus.PLATFORM_ERROR and "exited" in res.error
    assert [e.text for e in memos.read_all()] == ["User has a cat named Pixel"]


def test_tiny_random_model_output_is_policy_error(tmp_path, server, tiny_random_policy, memos):
    server.set_replies(tiny_random_policy)
    memos.open(tmp_path / "bank", create=True)
    for _ in range(2):
        res = memos.write_chunk(CHUNK, "s1", "2023-03-05")
        assert res.status is WriteStatus.POLICY_ERROR and res.num_llm_calls == 1, res
    assert memos.count() == 0
