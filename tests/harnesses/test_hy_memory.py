"""hy-memory 2.0.6 end to end in its own venv sandbox (scenes chat, working, coding).

Skips (with the command that fixes it) when `.venvs/hy_memory` is absent; CI creates it with
`scripts/make_harness_venvs.sh hy_memory`.
"""

import json
import os
import signal
import subprocess

import pytest

from harnesses.base import Endpoint, WriteStatus
from harnesses.registry import REPO_ROOT, HarnessConfig, make_harness
from tests.doubles.openai_server import HttpFailure, StandInServer

from .conftest import CHUNK

HY_PY = REPO_ROOT / ".venvs" / "hy_memory" / "bin" / "python"
pytestmark = pytest.mark.skipif(
    not HY_PY.exists(), reason=f"{HY_PY} missing: run `scripts/make_harness_venvs.sh hy_memory` (about 3 min)"
)

TOOL_TRACE = [
    {"role": "user", "content": "Fix the timeout in the search client."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "apply_patch",
                    "arguments": json.dumps(
                        {"path": "src/search.py", "old": "timeout=5", "new": "timeout=30"}
                    ),
                },
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_1",
        "name": "apply_patch",
        "content": "Patch applied successfully",
    },
    {
        "role": "assistant",
        "content": "Raised the search client timeout from 5 to 30 seconds in src/search.py.",
    },
]
CODING_REPLY = json.dumps(
    {
        "experiences": [
            {
                "task": "Fix search client timeout",
                "search_keys": ["timeout", "search client"],
                "solution": "Raise timeout from 5 to 30 s in src/search.py",
                "boundary_envs": "python",
                "confidence": 0.9,
            }
        ],
        "fact": {
            "statement": "Search client timeout raised from 5 to 30 seconds in src/search.py",
            "files": ["src/search.py"],
        },
    }
)


def chat_reply(*contents):
    body = {
        "memory": [{"content": c, "tags": [], "owner": "user"} for c in contents],
        "intentions": [],
        "basic_info": {},
    }
    return "```json\n" + json.dumps(body) + "\n```"


def _harness(tmp_path, server, scene):
    llm = Endpoint(server.base_url, "traj-A", "policy", timeout_s=20)
    emb = Endpoint(server.base_url, "traj-A", "minilm", timeout_s=20)
    cfg = HarnessConfig(framework="hy_memory", scene=scene, num_retries=0)
    return make_harness(cfg, llm, emb, sandbox_root=tmp_path, sandbox_id="traj-A")


@pytest.fixture
def chat(tmp_path, server):
    h = _harness(tmp_path, server, "chat")
    yield h
    h.shutdown()


def test_chat_scripted_policy_stores_and_search_finds(tmp_path, minilm_embed):
    with StandInServer(
        [chat_reply("User has a cat named Pixel", "User moved to Lisbon in March 2023")],
        embed_fn=minilm_embed,
    ) as srv:
        h = _harness(tmp_path, srv, "chat")
        try:
            meta = h.open(tmp_path / "bank", create=True)
            res = h.write_chunk(CHUNK, "s1", "2023-03-05", chunk_index=3)
            assert (res.status, res.num_llm_calls, res.num_added) == (WriteStatus.OK, 1, 2), res
            entries = h.read_all()
            assert sorted(e.text for e in entries) == [
                "User has a cat named Pixel",
                "User moved to Lisbon in March 2023",
            ]
            assert {e.metadata["memory_at"] for e in entries} == {
                "2023-03-05T00:00:00"
            }  # the chunk date, not today
            hit = h.search("what is the name of the cat?", 1)[0]  # hy-memory renders "Memory: ...\nWhen: ..."
            assert "User has a cat named Pixel" in hit.text and hit.id in {e.id for e in entries}
            chat_req = srv.chat_requests()
            assert len(chat_req) == 1 and chat_req[0].headers["X-Hymem-Chunk-Index"] == "3"
            assert chat_req[0].api_key == "traj-A"
            assert h.call("stats")["num_foreign_calls"] == 0
            # silent failure bank-not-carried: new process, reopen from disk
            h.close()
            h.shutdown()
            h.open(tmp_path / "bank")
            assert "User has a cat named Pixel" in [e.text for e in h.read_all()]
            assert h.metadata().bank_id == meta.bank_id
            h.close()
            kids = h.fork(tmp_path / "bank", [tmp_path / "k0", tmp_path / "k1"])
            h.open(tmp_path / "k1")
            assert (
                h.count() == 2
                and h.metadata().lineage == (meta.bank_id,)
                and kids[1].bank_id == h.metadata().bank_id
            )
        finally:
            h.shutdown()


def test_chat_malformed_output_gives_policy_errors(tmp_path, server, chat):
    chat.open(tmp_path / "bank", create=True)
    for reply in [
        "The user adopted a cat.",  # prose: json_repair may turn it into something, still a policy error
        "{}",  # hy-memory reports success with zero memories: silent failure malformed-as-platform-error
        "",  # EMPTY_RESPONSE
        '{"memory": ["User has a cat"]}',  # items are not objects
        '{"memory": [],,}',  # only json_repair can read it, and it yields zero memories
    ]:
        server.set_replies([reply])
        res = chat.write_chunk(CHUNK, "s1", "2023-03-05")
        assert res.status is WriteStatus.POLICY_ERROR, (reply, res)
    assert chat.count() == 0
    server.set_replies([chat_reply()])  # clean "nothing to store"
    assert chat.write_chunk(CHUNK, "s1", "2023-03-05").status is WriteStatus.OK
    # lenient but honest: repaired JSON that still yields a memory is usable output
    server.set_replies(['{"memory": [{"content": "User has a cat named Pixel",}]'])
    res = chat.write_chunk(CHUNK, "s1", "2023-03-05")
    assert (res.status, res.num_added) == (WriteStatus.OK, 1)


def test_chat_platform_errors_and_kill_mid_write(tmp_path, server, chat):
    server.set_replies([chat_reply("User has a cat named Pixel")])
    chat.open(tmp_path / "bank", create=True)
    assert chat.write_chunk(CHUNK, "s1", "2023-03-05").ok
    server.set_replies([HttpFailure(500)])
    res = chat.write_chunk(CHUNK, "s2", "2023-03-06")
    assert res.status is WriteStatus.PLATFORM_ERROR and chat.count() == 1

    def kill_then_answer(body):
        os.kill(chat.pid, signal.SIGKILL)
        return chat_reply("half written")

    server.set_replies(kill_then_answer)
    res = chat.write_chunk(CHUNK, "s3", "2023-03-07")
    assert res.status is WriteStatus.PLATFORM_ERROR and "exited" in res.error
    assert [e.text for e in chat.read_all()] == ["User has a cat named Pixel"]


@pytest.mark.parametrize("scene", ["coding", "working"])
def test_coding_and_working_take_tool_traces(tmp_path, server, scene):
    h = _harness(tmp_path, server, scene)
    try:
        server.set_replies([CODING_REPLY])
        h.open(tmp_path / "bank", create=True)
        res = h.write_chunk(TOOL_TRACE, "s1", "2023-03-05")
        assert res.status is WriteStatus.OK and res.num_llm_calls >= 1, res
        texts = [e.text for e in h.read_all()]
        assert "Search client timeout raised from 5 to 30 seconds in src/search.py" in texts
        assert "Fix search client timeout\nRaise timeout from 5 to 30 s in src/search.py" in texts
        assert h.count() == len(texts) == 2
        # the tool call's path/old/new reached the policy's prompt
        assert '"old":"timeout=5"' in server.chat_requests()[0].body["messages"][-1]["content"].replace(
            " ", ""
        )
        server.set_replies(['{"experiences": "none"}'])
        assert h.write_chunk(TOOL_TRACE, "s2", "2023-03-06").status is WriteStatus.POLICY_ERROR
    finally:
        h.shutdown()


@pytest.mark.slow
def test_hidden_10000_listing_cap(tmp_path, server):
    """Silent failure capped-read-all: hy-memory's list_memories/memory_stats stop at 10,000; read_all == count."""
    h = _harness(tmp_path, server, "chat")
    h.open(tmp_path / "bank", create=True)
    h.close()
    h.shutdown()
    script = r"""
import sys, random
from harnesses.adapters.hy_memory import HyMemoryHarness
from harnesses.base import Endpoint
e = Endpoint(sys.argv[2], "traj-A", "minilm")
h = HyMemoryHarness(e, e, scene="chat")
h.open(sys.argv[1])
coll = h._client._vector_store._collection
rng = random.Random(0)
n = 10_050
for s in range(0, n, 1000):
    ids = [f"node-{i}" for i in range(s, min(n, s + 1000))]
    coll.add(ids=ids, embeddings=[[rng.random() for _ in range(384)] for _ in ids],
             metadatas=[{"user_id": "user", "agent_id": "default_agent", "layer": "l2_fact", "status": "active",
                         "content": f"fact {i}", "node_id": i} for i in ids])
listed = h._client.list_memories(user_id="user", limit=100, offset=0)["vdb"]["total"]
stats = h._client.memory_stats(user_id="user")["scenes"]["chat"]["count"]
entries = h.read_all()
print("RESULT", listed, stats, len(entries), h.count())
h.close()
"""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HOME": str(tmp_path), "ANONYMIZED_TELEMETRY": "False"}
    out = subprocess.run(
        [str(HY_PY), "-c", script, str(tmp_path / "bank"), server.base_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    listed, stats, n_read, n_count = map(int, line.split()[1:])
    assert (listed, stats) == (10_000, 10_000)  # the framework's own views are capped, silently
    assert n_read == n_count == 10_050


def test_tiny_random_model_output_is_policy_error(tmp_path, server, chat, tiny_random_policy):
    server.set_replies(tiny_random_policy)
    chat.open(tmp_path / "bank", create=True)
    for _ in range(2):
        res = chat.write_chunk(CHUNK, "s1", "2023-03-05")
        assert res.status is WriteStatus.POLICY_ERROR, res
    assert chat.count() == 0


def test_a_writer_endpoint_timeout_is_the_writers_failure(tmp_path, server):
    """As for mem0: a chat write whose LLM answers slower than its timeout is `writer_timeout`; an HTTP
    500 is a plain platform error."""
    llm = Endpoint(server.base_url, "traj-A", "policy", timeout_s=1)
    emb = Endpoint(server.base_url, "traj-A", "minilm", timeout_s=20)
    cfg = HarnessConfig(framework="hy_memory", scene="chat", num_retries=0)
    h = make_harness(cfg, llm, emb, sandbox_root=tmp_path, sandbox_id="traj-A")
    try:
        h.open(tmp_path / "bank", create=True)
        server.set_replies(lambda body: HttpFailure(500))
        res = h.write_chunk(CHUNK, "s1", "2023-03-05")
        assert res.status is WriteStatus.PLATFORM_ERROR and not res.writer_timeout
        server.set_replies(lambda body: HttpFailure(500, delay_s=5.0))
        res = h.write_chunk(CHUNK, "s2", "2023-03-06")
        assert res.status is WriteStatus.PLATFORM_ERROR and res.writer_timeout, res
    finally:
        h.shutdown()
