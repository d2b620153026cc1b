"""Native harness: protocol, honest parsing (silent failure malformed-as-platform-error), persistence (1), caps (6), fork, bad input."""

import fcntl
import json
import os
import random
import sqlite3
import threading

import pytest

from harnesses.base import (
    BankMismatchError,
    BankStateError,
    ConfigurationError,
    Endpoint,
    PlatformError,
    WriteStatus,
    read_bank_meta,
)
from harnesses.native import NativeConfig, NativeHarness, parse_ops
from tests.doubles.openai_server import HttpFailure

from .conftest import CHUNK

ADD_TWO = json.dumps(
    {
        "ops": [
            {"op": "ADD", "text": "User moved to Lisbon in March 2023"},
            {"op": "ADD", "text": "User has a cat named Pixel"},
        ]
    }
)


def _snapshot(d):
    return {p: open(os.path.join(d, p), "rb").read() for p in sorted(os.listdir(d)) if p != "bank.lock"}


# ---------------------------------------------------------------- parse_ops (pure)
def test_parse_ops_clean_and_repaired():
    clean = parse_ops('{"ops": [{"op": "NONE"}]}')
    assert clean is not None and clean.ops == [{"op": "NONE"}] and not clean.repaired
    fenced = parse_ops('Sure!\n```json\n{"ops": [{"op": "ADD", "text": "a"},]}\n```')
    assert fenced is not None and fenced.repaired and fenced.ops == [{"op": "ADD", "text": "a"}]
    bare_list = parse_ops('[{"op": "DELETE", "id": 3}]')
    assert bare_list is not None and bare_list.ops == [{"op": "DELETE", "id": 3}] and not bare_list.repaired
    assert parse_ops("I think the user likes cats.") is None
    assert parse_ops('{"memories": ["x"]}') is None


# ---------------------------------------------------------------- write path
def test_scripted_policy_stores_expected_memories_and_search_finds_them(tmp_path, server, llm):
    server.set_replies([ADD_TWO])
    h = NativeHarness(llm)
    h.open(tmp_path / "bank", create=True)
    res = h.write_chunk(CHUNK, "s1", "2023-03-05", chunk_index=0)
    assert res.status is WriteStatus.OK and res.num_llm_calls == 1 and res.num_added == 2
    texts = [e.text for e in h.read_all()]
    assert texts == ["User moved to Lisbon in March 2023", "User has a cat named Pixel"]
    hits = h.search("what is the name of the cat", 1)
    assert [e.text for e in hits] == ["User has a cat named Pixel"]
    req = server.chat_requests()[-1]
    assert req.api_key == "traj-A" and req.headers.get("X-Hymem-Chunk-Index") == "0"
    assert "I moved to Lisbon" in req.body["messages"][1]["content"]
    h.close()


def test_update_delete_and_context_memories_in_prompt(tmp_path, server, llm):
    server.set_replies(
        [
            ADD_TWO,
            '{"ops": [{"op": "UPDATE", "id": 1, "text": "User moved to Porto"}, {"op": "DELETE", "id": 2}]}',
        ]
    )
    h = NativeHarness(llm)
    h.open(tmp_path / "bank", create=True)
    h.write_chunk(CHUNK, "s1", "2023-03-05")
    res = h.write_chunk(
        [{"role": "user", "content": "Actually I moved to Porto, and Pixel the cat ran away."}],
        "s2",
        "2023-04-01",
    )
    assert (res.status, res.num_updated, res.num_deleted) == (WriteStatus.OK, 1, 1)
    assert [(e.id, e.text) for e in h.read_all()] == [("1", "User moved to Porto")]
    # the second prompt showed the existing memories with their ids
    assert "[2] User has a cat named Pixel" in server.chat_requests()[-1].body["messages"][1]["content"]
    h.close()


@pytest.mark.parametrize(
    "reply, why",
    [
        ("The user moved to Lisbon.", "not JSON ops"),
        (
            '```json\n{"ops": [{"op": "NONE"},]}\n```',
            "repaired JSON",
        ),  # repair + zero memories = policy error
        ('{"ops": [{"op": "UPDATE", "id": 99, "text": "x"}]}', "only invalid ops"),
        ('{"ops": []}', "empty op list"),
        ('{"ops": [{"op": "ADD"}]}', "only invalid ops"),
    ],
)
def test_malformed_output_is_policy_error_not_crash(tmp_path, server, llm, reply, why):
    server.set_replies([reply])
    h = NativeHarness(llm)
    h.open(tmp_path / "bank", create=True)
    res = h.write_chunk(CHUNK, "s1", "2023-03-05")
    assert res.status is WriteStatus.POLICY_ERROR and res.num_llm_calls == 1
    assert why in res.error
    assert h.count() == 0
    h.close()


def test_clean_none_is_ok_and_partial_validity_is_reported(tmp_path, server, llm):
    server.set_replies(
        ['{"ops": [{"op": "NONE"}]}', '{"ops": [{"op": "ADD", "text": "a fact"}, {"op": "FOO"}]}']
    )
    h = NativeHarness(llm)
    h.open(tmp_path / "bank", create=True)
    assert h.write_chunk(CHUNK, "s1", "d").status is WriteStatus.OK
    res = h.write_chunk(CHUNK, "s1", "d")
    assert res.status is WriteStatus.OK and res.num_added == 1 and "ops[1]: unknown op 'FOO'" in res.error
    h.close()


def test_random_garbage_never_crashes(tmp_path, server, llm):
    rng = random.Random(0)
    alphabet = '{}[]":,opADDtextNONE 0123456789abc\n`'
    server.set_replies(lambda body: "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))))
    h = NativeHarness(llm)
    h.open(tmp_path / "bank", create=True)
    for _ in range(40):
        res = h.write_chunk(CHUNK, "s1", "d")
        assert res.status in (WriteStatus.OK, WriteStatus.POLICY_ERROR)
    assert h.count() == len(h.read_all())
    h.close()


@pytest.mark.parametrize("failure", [HttpFailure(500), HttpFailure(503)])
def test_endpoint_failure_is_platform_error_and_bank_unchanged(tmp_path, server, llm, failure):
    server.set_replies([ADD_TWO, failure])
    h = NativeHarness(llm)
    h.open(tmp_path / "bank", create=True)
    h.write_chunk(CHUNK, "s1", "d")
    res = h.write_chunk(CHUNK, "s1", "d")
    assert res.status is WriteStatus.PLATFORM_ERROR and res.num_llm_calls == 0
    assert str(failure.status) in res.error and h.count() == 2
    h.close()


def test_timeout_is_platform_error(tmp_path, server):
    server.set_replies([HttpFailure(200, delay_s=2.0)])
    h = NativeHarness(Endpoint(server.base_url, "traj-A", "m", timeout_s=0.3))
    h.open(tmp_path / "bank", create=True)
    res = h.write_chunk(CHUNK, "s1", "d")
    assert res.status is WriteStatus.PLATFORM_ERROR and "Timeout" in res.error
    h.close()


def test_foreign_credential_rejected_is_platform_error(tmp_path, server):
    h = NativeHarness(Endpoint(server.base_url, "traj-Z", "m"))
    h.open(tmp_path / "bank", create=True)
    res = h.write_chunk(CHUNK, "s1", "d")
    assert res.status is WriteStatus.PLATFORM_ERROR and "401" in res.error
    assert server.chat_requests(status=401)[-1].api_key == "traj-Z"
    h.close()


# ---------------------------------------------------------------- persistence, caps, tokens
def test_bank_reopened_from_disk_holds_known_record(tmp_path, server, llm):
    """Silent failure bank-not-carried: close, drop every object, reopen from disk in a new harness."""
    server.set_replies([ADD_TWO])
    h = NativeHarness(llm)
    meta = h.open(tmp_path / "bank", create=True)
    h.write_chunk(CHUNK, "s1", "2023-03-05")
    h.close()
    del h
    h2 = NativeHarness(None)
    meta2 = h2.open(tmp_path / "bank")
    assert meta2.bank_id == meta.bank_id
    assert "User has a cat named Pixel" in [e.text for e in h2.read_all()]
    h2.close()


def test_apply_ops_writes_without_an_llm_through_the_same_path(tmp_path):
    """apply_ops: a reply applied as write_chunk applies one (the reader self-checks fill banks so)."""
    h = NativeHarness(None)
    h.open(tmp_path / "bank", create=True)
    res = h.apply_ops(ADD_TWO, "s1", "2023-03-05", chunk_index=2)
    assert res.status is WriteStatus.OK and res.num_added == 2 and res.num_llm_calls == 0
    first = h.read_all()[0]
    assert first.metadata == {"session_id": "s1", "date": "2023-03-05"}
    upd = json.dumps({"ops": [{"op": "UPDATE", "id": int(first.id), "text": "User moved to Oslo"}]})
    assert h.apply_ops(upd, "s2", "2023-03-12").num_updated == 1
    assert [e.text for e in h.search("where did the user move", 1)] == ["User moved to Oslo"]
    # the write path's honesty holds here too: garbage and an empty op list are policy errors
    assert h.apply_ops("not json", "s3", "2023-03-19").status is WriteStatus.POLICY_ERROR
    assert h.apply_ops('{"ops": []}', "s3", "2023-03-19").status is WriteStatus.POLICY_ERROR
    assert h.count() == 2
    h.close()
    with pytest.raises(BankStateError):
        h.apply_ops(ADD_TWO, "s1", "2023-03-05")


def test_read_all_has_no_cap_and_checks_count(tmp_path):
    """Silent failure capped-read-all: 12,000 rows (above a 10,000-style cap) all come back; a short listing raises."""
    h = NativeHarness(None)
    h.open(tmp_path / "bank", create=True)
    with h._db:  # one transaction, not 12,000 fsyncs
        h._db.execute("BEGIN")
        h._db.executemany(
            "INSERT INTO memories(text, session_id, date) VALUES (?, 's', 'd')",
            [(f"fact {i}",) for i in range(12000)],
        )
    entries = h.read_all()
    assert len(entries) == 12000 == h.count() and entries[-1].text == "fact 11999"
    # an independent count that disagrees with the listing must fail loudly
    h.count = lambda: 12001  # type: ignore[method-assign]
    with pytest.raises(PlatformError, match="12000 entries but count"):
        h.read_all()
    h.close()


def test_size_tokens_counts_canonical_text_only(tmp_path):
    """Token accounting on its own: sum of per-entry tokens of the memory text, no special tokens."""

    class WordTok:
        def encode(self, text, add_special_tokens=True):
            return ([0] if add_special_tokens else []) + [1] * len(text.split())

    h = NativeHarness(None)
    h.open(tmp_path / "bank", create=True)
    assert h.size_tokens(WordTok()) == 0
    h._db.executemany(
        "INSERT INTO memories(text, session_id, date) VALUES (?, 'a-long-session-id', '2023-01-01')",
        [("one two three",), ("four five",)],
    )
    assert h.size_tokens(WordTok()) == 5  # 3 + 2: ids, dates and session ids are not bank tokens
    assert h.size_tokens(lambda s: list(s)) == len("one two three") + len("four five")
    h.close()


# ---------------------------------------------------------------- fork
def test_fork_makes_independent_copies_with_lineage(tmp_path, server, llm):
    server.set_replies([ADD_TWO, '{"ops": [{"op": "ADD", "text": "only in fork 0"}]}'])
    h = NativeHarness(llm)
    parent = h.open(tmp_path / "p", create=True)
    h.write_chunk(CHUNK, "s1", "d")
    with pytest.raises(BankStateError, match="open bank"):
        h.fork(tmp_path / "p", [tmp_path / "x"])
    h.close()
    kids = h.fork(tmp_path / "p", [tmp_path / f"c{i}" for i in range(3)])
    assert len({k.bank_id for k in kids} | {parent.bank_id}) == 4
    assert all(k.lineage == (parent.bank_id,) for k in kids)
    h.open(tmp_path / "c0")
    h.write_chunk(CHUNK, "s2", "d")
    assert h.count() == 3
    h.close()
    for d in ("p", "c1", "c2"):
        h.open(tmp_path / d)
        assert h.count() == 2
        h.close()
    with pytest.raises(BankStateError, match="already exists"):
        h.fork(tmp_path / "p", [tmp_path / "c1"])
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no half-written fork left


def test_concurrent_forks_of_one_parent_all_succeed(tmp_path, server, llm):
    """The report's 8 rollouts of a window fork the same parent at the same moment. The fork-time
    probe used to take the exclusive lock, so a concurrent probe saw the bank "open" and its rollout
    ended as a platform error (found as 6 segments instead of 8 in the 2-rank stage test)."""
    server.set_replies([ADD_TWO])
    h = NativeHarness(llm)
    h.open(tmp_path / "p", create=True)
    h.write_chunk(CHUNK, "s1", "d")
    h.close()
    # injected: another rollout is mid-probe (holds its instant shared lock) while this one forks
    fd = os.open(tmp_path / "p" / "bank.lock", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    try:
        h.fork(tmp_path / "p", [tmp_path / "probe_held"])
        # a writer opening the bank during a probe waits out the probe instead of failing
        threading.Timer(0.2, fcntl.flock, (fd, fcntl.LOCK_UN)).start()
        h.open(tmp_path / "p")
        h.close()
    finally:
        os.close(fd)
    # the real race: 8 threads (8 rollouts) forking one parent, 25 rounds; every fork must succeed
    errors: list[BaseException] = []

    def fork(r: int, i: int) -> None:
        try:
            h.fork(tmp_path / "p", [tmp_path / f"r{r}" / f"c{i}"])
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    for r in range(25):
        threads = [threading.Thread(target=fork, args=(r, i)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    assert len(list(tmp_path.glob("r*/c*/bank.json"))) == 200
    # an open bank is still refused
    h.open(tmp_path / "p")
    with pytest.raises(BankStateError, match="open bank"):
        h.fork(tmp_path / "p", [tmp_path / "while_open"])
    h.close()


# ---------------------------------------------------------------- bad input
def test_bad_input_clear_errors_and_bank_untouched(tmp_path, server, llm):
    server.set_replies([ADD_TWO])
    with pytest.raises(ConfigurationError, match="unknown scene 'coding'"):
        NativeHarness(llm, scene="coding")
    h = NativeHarness(llm)
    h.open(tmp_path / "bank", create=True)
    h.write_chunk(CHUNK, "s", "d")
    h.close()
    before = _snapshot(tmp_path / "bank")
    # another config (different behaviour) -> refused
    with pytest.raises(BankMismatchError, match="config_hash"):
        NativeHarness(llm, NativeConfig(num_context_memories=3)).open(tmp_path / "bank")
    # another framework / version in bank.json -> refused, naming the key
    meta = json.loads((tmp_path / "bank" / "bank.json").read_text())
    for key, val in (("framework", "mem0"), ("framework_version", "0")):
        bad = tmp_path / f"bad-{key}"
        bad.mkdir()
        (bad / "bank.json").write_text(json.dumps({**meta, key: val}))
        with pytest.raises(BankMismatchError, match=f"{key}="):
            h.open(bad)
    with pytest.raises(BankStateError, match="no bank here"):
        h.open(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()
    assert _snapshot(tmp_path / "bank") == before
    # the lock is released by close(): another harness can open it
    h.open(tmp_path / "bank")
    with pytest.raises(BankStateError, match="open elsewhere"):
        NativeHarness(llm).open(tmp_path / "bank")
    h.close()
    assert read_bank_meta(tmp_path / "bank").framework == "native"


def test_write_is_atomic_on_store_failure(tmp_path, server, llm):
    """A store failure mid-write rolls back every op of the chunk and is a platform error."""
    server.set_replies([ADD_TWO])
    h = NativeHarness(llm)
    h.open(tmp_path / "bank", create=True)
    h._db.execute(
        "CREATE TRIGGER boom BEFORE INSERT ON memories WHEN new.text LIKE '%Pixel%' BEGIN SELECT RAISE(ABORT, 'disk full'); END"
    )
    res = h.write_chunk(CHUNK, "s", "d")
    assert res.status is WriteStatus.PLATFORM_ERROR and "disk full" in res.error
    assert h.count() == 0  # the first ADD of the chunk was rolled back too
    h.close()
    assert (
        sqlite3.connect(tmp_path / "bank" / "memories.sqlite")
        .execute("select count(*) from memories")
        .fetchone()[0]
        == 0
    )


def test_tiny_random_model_output_is_policy_error(tmp_path, server, llm, tiny_random_policy):
    server.set_replies(tiny_random_policy)
    h = NativeHarness(llm)
    h.open(tmp_path / "bank", create=True)
    for _ in range(3):
        res = h.write_chunk(CHUNK, "s1", "2023-03-05")
        assert res.status is WriteStatus.POLICY_ERROR and res.num_llm_calls == 1, res
    h.close()
