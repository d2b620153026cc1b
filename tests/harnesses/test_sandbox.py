"""Sandbox server/client, hosting the native harness in a child process (no framework venv needed).

Crash -> platform error with the bank restored (silent failure platform-error-as-reward); foreign identity refused (8);
reopen from disk (1); confinement to the sandbox root; bad input (unknown framework/scene, missing venv).
"""

import json
import os
import signal

import pytest

from harnesses.base import (
    BankMismatchError,
    ConfigurationError,
    Endpoint,
    IdentityError,
    WriteStatus,
)
from harnesses.registry import HarnessConfig, make_harness
from harnesses.sandbox import SandboxClient
from tests.doubles.openai_server import HttpFailure

from .conftest import CHUNK

ADD = json.dumps({"ops": [{"op": "ADD", "text": "User has a cat named Pixel"}]})


@pytest.fixture
def client(tmp_path, llm):
    c = make_harness(
        HarnessConfig(framework="native", num_retries=1), llm, sandbox_root=tmp_path, sandbox_id="traj-A"
    )
    assert isinstance(c, SandboxClient)
    yield c
    c.shutdown()


def test_native_in_sandbox_end_to_end(tmp_path, server, client):
    server.set_replies([ADD])
    meta = client.open(tmp_path / "bank", create=True)
    assert meta.framework == "native" and client.pid != os.getpid()
    res = client.write_chunk(CHUNK, "s1", "2023-03-05", chunk_index=4)
    assert res.status is WriteStatus.OK and res.num_llm_calls == 1 and res.num_attempts == 1
    assert server.chat_requests()[-1].headers["X-Hymem-Chunk-Index"] == "4"
    assert [e.text for e in client.search("cat name", 3)] == ["User has a cat named Pixel"]
    assert client.count() == 1 == len(client.read_all())
    assert client.size_tokens(lambda s: s.split()) == 6  # "User has a cat named Pixel"
    client.close()
    kids = client.fork(tmp_path / "bank", [tmp_path / "k0", tmp_path / "k1"])
    assert [k.lineage for k in kids] == [(meta.bank_id,)] * 2
    # silent failure bank-not-carried: a fresh sandbox process reopens the bank from disk
    client.shutdown()
    client.open(tmp_path / "k1")
    assert [e.text for e in client.read_all()] == ["User has a cat named Pixel"]
    assert client.metadata().bank_id == kids[1].bank_id


def test_policy_error_passes_through_unretried(tmp_path, server, client):
    server.set_replies(["no json here"])
    client.open(tmp_path / "bank", create=True)
    res = client.write_chunk(CHUNK, "s1", "d")
    assert res.status is WriteStatus.POLICY_ERROR and res.num_attempts == 1
    assert len(server.chat_requests()) == 1


def _killer(server, client, then):
    """A reply that first kills the sandbox process mid-write (SIGKILL), then answers."""

    def reply(body):
        if not reply.killed:
            reply.killed = True
            os.kill(client.pid, signal.SIGKILL)
        return then

    reply.killed = False
    return reply


def test_killed_sandbox_mid_write_is_platform_error_and_bank_restored(tmp_path, server, llm):
    """Silent failure platform-error-as-reward: a killed process is a platform error, not an empty bank marked done."""
    c = make_harness(
        HarnessConfig(framework="native", num_retries=0), llm, sandbox_root=tmp_path, sandbox_id="traj-A"
    )
    try:
        server.set_replies([ADD])
        c.open(tmp_path / "bank", create=True)
        c.write_chunk(CHUNK, "s1", "d")
        server.set_replies(_killer(server, c, json.dumps({"ops": [{"op": "ADD", "text": "half written"}]})))
        res = c.write_chunk(CHUNK, "s2", "d")
        assert res.status is WriteStatus.PLATFORM_ERROR and "exited" in res.error
        # the bank is the pre-write bank, served by a restarted sandbox
        assert [e.text for e in c.read_all()] == ["User has a cat named Pixel"]
        assert c.num_restarts == 1
        assert not [p for p in os.listdir(tmp_path) if p.startswith(".bank")]
    finally:
        c.shutdown()


def test_platform_error_is_retried_then_succeeds(tmp_path, server, client):
    client.open(tmp_path / "bank", create=True)
    server.set_replies(_killer(server, client, ADD))
    res = client.write_chunk(CHUNK, "s1", "d")
    assert res.status is WriteStatus.OK and res.num_attempts == 2 and client.count() == 1


def test_rpc_timeout_kills_and_reports_platform_error(tmp_path, server, llm):
    c = make_harness(
        HarnessConfig(framework="native", num_retries=0, rpc_timeout_s=1.0),
        Endpoint(server.base_url, "traj-A", "m", timeout_s=30),
        sandbox_root=tmp_path,
        sandbox_id="traj-A",
    )
    try:
        c.open(tmp_path / "bank", create=True)
        server.set_replies([HttpFailure(200, delay_s=3.0)])
        res = c.write_chunk(CHUNK, "s1", "d")
        assert res.status is WriteStatus.PLATFORM_ERROR and "no answer within 1 s" in res.error
        assert c.count() == 0
    finally:
        c.shutdown()


def test_foreign_identity_is_refused_and_nothing_runs(tmp_path, server, client):
    """Silent failure shared-identity: a request from sandbox A carrying sandbox B's identity is rejected."""
    server.set_replies([ADD])
    client.open(tmp_path / "bank", create=True)
    client.write_chunk(CHUNK, "s1", "d")
    n_calls = len(server.requests)
    with pytest.raises(IdentityError, match="carries identity 'traj-B'"):
        client.call("write_chunk", sandbox_id="traj-B", messages=CHUNK, session_id="s", date="d")
    with pytest.raises(IdentityError):
        client.call("read_all", sandbox_id="traj-B")
    assert len(server.requests) == n_calls and client.count() == 1


def test_sandbox_only_touches_its_root(tmp_path, tmp_path_factory, server, client):
    other = tmp_path_factory.mktemp("other")
    with pytest.raises(IdentityError, match="outside its root"):
        client.open(other / "bank", create=True)
    with pytest.raises(IdentityError, match="outside its root"):
        client.open(tmp_path / ".." / other.name / "bank", create=True)
    assert not (other / "bank").exists()


def test_bad_input_names_the_thing(tmp_path, server, llm):
    with pytest.raises(ConfigurationError, match="unknown harness framework 'letta'"):
        make_harness(HarnessConfig(framework="letta"), llm, sandbox_root=tmp_path, sandbox_id="a")
    with pytest.raises(ConfigurationError, match="unknown scene 'voice'"):
        make_harness(
            HarnessConfig(framework="hy_memory", scene="voice"), llm, sandbox_root=tmp_path, sandbox_id="a"
        )
    with pytest.raises(
        ConfigurationError, match=r"venv missing \(.*nowhere/mem0/bin/python not found\).*make_harness_venvs"
    ):
        make_harness(
            HarnessConfig(framework="mem0", venv_root=str(tmp_path / "nowhere")),
            llm,
            sandbox_root=tmp_path,
            sandbox_id="a",
        )
    with pytest.raises(ConfigurationError, match="only 'native' runs in-process"):
        make_harness(
            HarnessConfig(framework="mem0", in_process=True), llm, sandbox_root=tmp_path, sandbox_id="a"
        )


def test_bank_of_another_framework_is_refused_unmodified(tmp_path, server, client):
    bank = tmp_path / "bank"
    bank.mkdir()
    meta = {
        "framework": "mem0",
        "framework_version": "2.2.1",
        "scene": "default",
        "config_hash": "x",
        "bank_id": "b",
        "lineage": [],
    }
    (bank / "bank.json").write_text(json.dumps(meta))
    before = sorted(os.listdir(bank))
    with pytest.raises(BankMismatchError, match="framework='mem0'"):
        client.open(bank)
    assert sorted(os.listdir(bank)) == before and json.loads((bank / "bank.json").read_text()) == meta


def test_without_snapshot_a_crash_is_reported_as_unusable_bank(tmp_path, server, llm):
    with pytest.raises(ConfigurationError, match="needs harness.snapshot_before_write"):
        make_harness(
            HarnessConfig(framework="native", snapshot_before_write=False),
            llm,
            sandbox_root=tmp_path,
            sandbox_id="a",
        )
    cfg = HarnessConfig(framework="native", num_retries=0, snapshot_before_write=False)
    c = make_harness(cfg, llm, sandbox_root=tmp_path, sandbox_id="traj-A")
    try:
        c.open(tmp_path / "bank", create=True)
        server.set_replies(_killer(server, c, ADD))
        res = c.write_chunk(CHUNK, "s1", "d")
        assert res.status is WriteStatus.PLATFORM_ERROR and "discard it" in res.error
        assert not [p for p in os.listdir(tmp_path) if p.startswith(".bank")]  # no snapshot was taken
    finally:
        c.shutdown()
