"""mem0ai 2.2.1 end to end in its own venv sandbox, against the stand-in OpenAI server.

Skips (with the command that fixes it) when `.venvs/mem0` is absent; CI creates it with
`scripts/make_harness_venvs.sh mem0`.
"""

import json
import os
import random
import signal
import subprocess

import pytest

from harnesses.adapters.mem0 import SCROLL_PAGE
from harnesses.base import BankMismatchError, ConfigurationError, Endpoint, WriteStatus
from harnesses.native import NativeHarness
from harnesses.registry import REPO_ROOT, HarnessConfig, make_harness
from tests.doubles.openai_server import HttpFailure

from .conftest import CHUNK

MEM0_PY = REPO_ROOT / ".venvs" / "mem0" / "bin" / "python"
pytestmark = pytest.mark.skipif(
    not MEM0_PY.exists(), reason=f"{MEM0_PY} missing: run `scripts/make_harness_venvs.sh mem0` (about 20 s)"
)


def _reply(*texts):
    return json.dumps({"memory": [{"id": str(i), "text": t} for i, t in enumerate(texts)]})


@pytest.fixture
def mem0(tmp_path, server):
    llm = Endpoint(server.base_url, "traj-A", "policy", timeout_s=10)
    emb = Endpoint(server.base_url, "traj-A", "minilm", timeout_s=10)
    h = make_harness(
        HarnessConfig(framework="mem0", num_retries=0), llm, emb, sandbox_root=tmp_path, sandbox_id="traj-A"
    )
    yield h
    h.shutdown()


def test_scripted_policy_stores_expected_memories_offline(tmp_path, server, mem0):
    server.set_replies([_reply("User has a cat named Pixel", "User moved to Lisbon in March 2023")])
    meta = mem0.open(tmp_path / "bank", create=True)
    assert (meta.framework, meta.framework_version) == ("mem0", "2.2.1")
    res = mem0.write_chunk(CHUNK, "s1", "2023-03-05", chunk_index=7)
    assert (res.status, res.num_llm_calls, res.num_added) == (WriteStatus.OK, 1, 2)
    assert sorted(e.text for e in mem0.read_all()) == [
        "User has a cat named Pixel",
        "User moved to Lisbon in March 2023",
    ]
    assert all(
        e.metadata["session_id"] == "s1" and e.metadata["date"] == "2023-03-05" for e in mem0.read_all()
    )
    assert mem0.search("what is the cat called", 1)[0].text == "User has a cat named Pixel"
    chat = server.chat_requests()
    assert len(chat) == 1 and chat[0].api_key == "traj-A" and chat[0].headers["X-Hymem-Chunk-Index"] == "7"
    # the chunk's date reaches mem0's own prompt (not today's date)
    assert "## Current Date\n2023-03-05" in chat[0].body["messages"][1]["content"]
    stats = mem0.call("stats")
    assert stats["num_foreign_calls"] == 0, stats["foreign_urls"]  # offline: nothing but the gateway
    # silent failure bank-not-carried: close, new sandbox process, reopen from disk
    mem0.close()
    mem0.shutdown()
    mem0.open(tmp_path / "bank")
    assert "User has a cat named Pixel" in [e.text for e in mem0.read_all()]
    assert mem0.metadata().bank_id == meta.bank_id


@pytest.mark.parametrize(
    "replies",
    [
        [
            "I will remember that the user has a cat.",  # prose
            '```json\n{"memory": [],}\n```',  # only parses after repair, zero memories
            '{"memories": [{"text": "x"}]}',  # wrong key: mem0 silently returns []
            '{"memory": ["User has a cat"]}',  # items are not objects
            "",  # empty reply
            '{"memory": [{"id": "0"}]}',  # no text
        ]
    ],
)
def test_malformed_output_gives_policy_errors_not_crashes(tmp_path, server, mem0, replies):
    mem0.open(tmp_path / "bank", create=True)
    for r in replies:
        server.set_replies([r])
        res = mem0.write_chunk(CHUNK, "s1", "2023-03-05")
        assert res.status is WriteStatus.POLICY_ERROR, (r, res)
        assert res.num_llm_calls == 1
    assert mem0.count() == 0
    server.set_replies(['{"memory": []}'])  # clean "nothing to store" is ok, not an error
    assert mem0.write_chunk(CHUNK, "s1", "2023-03-05").status is WriteStatus.OK


def test_random_bytes_policy_never_crashes(tmp_path, server, mem0):
    rng = random.Random(1)
    server.set_replies(
        lambda body: "".join(rng.choice('{}[]":,memorytext 01\n`') for _ in range(rng.randint(0, 60)))
    )
    mem0.open(tmp_path / "bank", create=True)
    statuses = {mem0.write_chunk(CHUNK, "s", "d").status for _ in range(8)}
    assert statuses <= {WriteStatus.OK, WriteStatus.POLICY_ERROR}
    assert mem0.count() == len(mem0.read_all())


def test_get_all_default_cap_vs_read_all(tmp_path, server, mem0):
    """Silent failure capped-read-all: mem0's get_all returns 20 by default; read_all returns every entry == count."""
    facts = [f"User fact number {i} is about topic {i * 7}" for i in range(45)]
    server.set_replies([_reply(*facts)])
    mem0.open(tmp_path / "bank", create=True)
    assert mem0.write_chunk(CHUNK, "s1", "d").num_added == 45
    entries = mem0.read_all()
    assert len(entries) == 45 == mem0.count() and sorted(e.text for e in entries) == sorted(facts)
    mem0.close()
    # the trap itself, through mem0's own API in its venv: a naive listing silently stops at 20
    script = (
        "import sys; from mem0 import Memory; from harnesses.adapters.mem0 import Mem0Harness;"
        "from harnesses.base import Endpoint; e=Endpoint(sys.argv[2],'traj-A','minilm');"
        "h=Mem0Harness(e,e); h.open(sys.argv[1]); print(len(h._mem.get_all(filters={'user_id':'user'})['results']))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MEM0_TELEMETRY": "False", "HOME": str(tmp_path)}
    out = subprocess.run(
        [str(MEM0_PY), "-c", script, str(tmp_path / "bank"), server.base_url],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "20"


@pytest.mark.slow
def test_read_all_follows_every_scroll_page(tmp_path, server, mem0):
    """Silent failure capped-read-all past one page: read_all scrolls Qdrant in pages of SCROLL_PAGE; a bank of more
    than one page (and not a multiple of it) comes back whole, every entry once, equal to count()."""
    n = SCROLL_PAGE + 44
    facts = [f"User fact number {i} is about topic {i * 7}" for i in range(n)]
    server.set_replies([_reply(*facts)])
    mem0.open(tmp_path / "bank", create=True)
    assert mem0.write_chunk(CHUNK, "s1", "d").num_added == n
    entries = mem0.read_all()
    assert mem0.count() == n
    assert len(entries) == n and len({e.id for e in entries}) == n
    assert sorted(e.text for e in entries) == sorted(facts)


def test_platform_errors_and_kill_mid_write(tmp_path, server, mem0):
    server.set_replies([_reply("User has a cat named Pixel")])
    mem0.open(tmp_path / "bank", create=True)
    mem0.write_chunk(CHUNK, "s1", "d")
    server.set_replies([HttpFailure(500)])  # LLM down: platform, bank untouched
    res = mem0.write_chunk(CHUNK, "s2", "d")
    assert res.status is WriteStatus.PLATFORM_ERROR and mem0.count() == 1

    def kill_then_answer(body):
        os.kill(mem0.pid, signal.SIGKILL)
        return _reply("half written fact")

    server.set_replies(kill_then_answer)  # silent failure platform-error-as-reward: killed mid-write
    res = mem0.write_chunk(CHUNK, "s3", "d")
    assert res.status is WriteStatus.PLATFORM_ERROR and "exited" in res.error
    assert [e.text for e in mem0.read_all()] == ["User has a cat named Pixel"]


def test_fork_and_foreign_bank(tmp_path, server, mem0):
    server.set_replies([_reply("User has a cat named Pixel"), _reply("Only in fork zero")])
    parent = mem0.open(tmp_path / "p", create=True)
    mem0.write_chunk(CHUNK, "s1", "d")
    mem0.close()
    kids = mem0.fork(tmp_path / "p", [tmp_path / "k0", tmp_path / "k1"])
    assert [k.lineage for k in kids] == [(parent.bank_id,)] * 2
    mem0.open(tmp_path / "k0")
    mem0.write_chunk(CHUNK, "s2", "d")
    assert mem0.count() == 2
    mem0.close()
    mem0.open(tmp_path / "k1")
    assert [e.text for e in mem0.read_all()] == ["User has a cat named Pixel"]
    mem0.close()
    # a native bank (another framework) is refused and left untouched

    nh = NativeHarness(None)
    nh.open(tmp_path / "native", create=True)
    nh.close()
    before = (tmp_path / "native" / "bank.json").read_bytes()
    with pytest.raises(BankMismatchError, match="framework='native'"):
        mem0.open(tmp_path / "native")
    assert (tmp_path / "native" / "bank.json").read_bytes() == before
    assert sorted(os.listdir(tmp_path / "native")) == ["bank.json", "bank.lock", "memories.sqlite"]


def test_tiny_random_model_output_is_policy_error(tmp_path, server, tiny_random_policy, mem0):
    server.set_replies(tiny_random_policy)
    mem0.open(tmp_path / "bank", create=True)
    for _ in range(2):
        res = mem0.write_chunk(CHUNK, "s1", "2023-03-05")
        assert res.status is WriteStatus.POLICY_ERROR and res.num_llm_calls == 1, res
    assert mem0.count() == 0


def test_venv_with_wrong_framework_version_is_refused(tmp_path, server):
    """A venv whose mem0ai is not the pinned one fails at sandbox start, naming venv, versions and fix."""
    fake = tmp_path / "fake_site"
    (fake / "mem0ai-9.9.9.dist-info").mkdir(parents=True)
    (fake / "mem0ai-9.9.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mem0ai\nVersion: 9.9.9\n"
    )
    py = tmp_path / "venvs" / "mem0" / "bin" / "python"
    py.parent.mkdir(parents=True)
    # the first mem0ai distribution on sys.path wins for importlib.metadata: the fake one
    py.write_text(f'#!/bin/sh\nexport PYTHONPATH="{fake}:$PYTHONPATH"\nexec "{MEM0_PY}" "$@"\n')
    py.chmod(0o755)
    llm = Endpoint(server.base_url, "traj-A", "policy")
    cfg = HarnessConfig(framework="mem0", venv_root=str(tmp_path / "venvs"))
    h = make_harness(cfg, llm, llm, sandbox_root=tmp_path / "sb", sandbox_id="traj-A")

    with pytest.raises(
        ConfigurationError, match=r"mem0ai is 9\.9\.9, harness pin is 2\.2\.1.*make_harness_venvs\.sh mem0"
    ):
        h.open(tmp_path / "sb" / "bank", create=True)
    assert not (tmp_path / "sb" / "bank").exists()
    h.shutdown()


def test_a_writer_endpoint_timeout_is_the_writers_failure(tmp_path, server):
    """The LLM answers slower than the writer's timeout: a platform error marked `writer_timeout` (the
    evaluation scores it 0 for that writer); an HTTP 500 from the same endpoint is not."""
    llm = Endpoint(server.base_url, "traj-A", "policy", timeout_s=0.5)
    emb = Endpoint(server.base_url, "traj-A", "minilm", timeout_s=10)
    h = make_harness(
        HarnessConfig(framework="mem0", num_retries=0), llm, emb, sandbox_root=tmp_path, sandbox_id="traj-A"
    )
    try:
        h.open(tmp_path / "bank", create=True)
        server.set_replies(lambda body: HttpFailure(500))
        res = h.write_chunk(CHUNK, "s1", "d")
        assert res.status is WriteStatus.PLATFORM_ERROR and not res.writer_timeout
        server.set_replies(lambda body: HttpFailure(500, delay_s=3.0))
        res = h.write_chunk(CHUNK, "s2", "d")
        assert res.status is WriteStatus.PLATFORM_ERROR and res.writer_timeout, res
    finally:
        h.shutdown()
