"""The real-data gold writer (data_pipeline/source_gold.py) through each harness's own write path: a
LoCoMo conversation and a LongMemEval haystack written chunk by chunk, the gold reply scripted by
`SourceGold`, and the bank then holds every gold memory of the written chunks, each once, although
mem0 and hy-memory show earlier chunks' turns in every later prompt. The frameworks run in their venv
sandboxes (skipped, with the command, where the venv is absent)."""

import json

import pytest

from data_pipeline.chunking import iso_date
from data_pipeline.source_gold import SourceGold, gold_memories, prompt_kind, turn_text
from data_pipeline.store import BuiltDataset
from harnesses.base import Endpoint, WriteStatus
from harnesses.native import NativeConfig
from harnesses.registry import REPO_ROOT, HarnessConfig, make_harness
from hymem_train.rollout.worker import chunk_messages
from tests.doubles.openai_server import StandInServer

LOCOMO_CHUNKS = 4  # of conv-26's 19: enough for earlier turns to be shown in later prompts
GOLD_MEMORY_CHARS = 4096  # as configs/exp/evaluate_locomo_bounds.yaml sets for the native harness
PROFILE = {"native": "mem0", "mem0": "mem0", "hy_memory": "hy_memory"}  # the evaluation's chunking


def _prompt(body) -> str:
    return "\n".join(str(m["content"]) for m in body["messages"])


def _chunks(ds, seq, n):
    return [c for c in ds.tables["chunks"] if c.sequence_id == seq][:n]


def test_gold_memories_of_the_slices(locomo_sample):
    ds = BuiltDataset(locomo_sample / "mem0")
    gold = gold_memories(ds)
    n_evidence = sum(t.has_answer for c in ds.tables["chunks"] for t in c.turns)
    assert sum(map(len, gold.values())) == len(ds.tables["facts"]) + n_evidence
    # dated by the session the fact's turn was said in ("1:56 pm on 8 May, 2023" as a reader reads it)
    first = gold[("locomo/conv-26", 0)][0]
    assert first.startswith("Caroline attended an LGBTQ support group") and first.endswith(
        "(said on 8 May 2023)"
    )
    lme = [m for (q, _), ms in gold.items() if q.startswith("longmemeval") for m in ms]
    assert any(m.startswith("user: I graduated with a degree in Business Administration") for m in lme)


def test_only_the_chunk_being_written_is_answered(locomo_sample):
    """mem0's prompt shows the previous chunk ("Last k Messages") before the new one: the reply holds the
    new chunk's memories only; a prompt with no whole chunk gets none, and is counted."""
    ds = BuiltDataset(locomo_sample / "mem0")
    g = SourceGold({"mem0": ds})
    c0, c1 = _chunks(ds, "locomo/conv-26", 2)

    def prompt(last, new):
        lines = lambda c: "\n".join(f"user: {m['content']}" for m in chunk_messages(c))  # noqa: E731
        return f"evidence-bound processor\n## Last k Messages\n{lines(last)}\n## New Messages\n{lines(new)}"

    reply = json.loads(g(prompt(c0, c1)))
    assert [m["text"] for m in reply["memory"]] == gold_memories(ds)[("locomo/conv-26", 1)]
    assert json.loads(g("evidence-bound processor\n## New Messages\nuser: hello"))["memory"] == []
    assert g.counts["unmatched"] == 1
    assert g("You are a memory management system.") == "{}"  # hy-memory's reconcile call
    with pytest.raises(ValueError, match="not a write prompt"):
        prompt_kind("Summarise this.")
    with pytest.raises(ValueError, match="no write path for"):
        SourceGold({"memoryos": ds})


def test_a_turn_shown_as_json_is_found(locomo_sample):
    """hy-memory lists the new messages as JSON: a line break inside a turn's head is "\\n" there, and
    the chunk must still be found (it was not: the first chunk of two LongMemEval haystacks)."""
    ds = BuiltDataset(locomo_sample / "hy_memory")
    c = next(
        c
        for c in ds.tables["chunks"]
        if any("\n" in turn_text(t)[:60] for t in c.turns) and gold_memories(ds).get((c.sequence_id, c.index))
    )
    g = SourceGold({"hy_memory": ds})
    prompt = "Extract durable, high-value memories\n## New Messages\n" + json.dumps(chunk_messages(c))
    assert g.chunk_of("hy_memory", prompt) == (c.sequence_id, c.index)
    assert g.memories("hy_memory", prompt) == gold_memories(ds)[(c.sequence_id, c.index)]


@pytest.mark.parametrize("framework", ["native", "mem0", "hy_memory"])
def test_gold_bank_through_the_write_path(framework, locomo_sample, tmp_path, minilm_embed):
    py = REPO_ROOT / ".venvs" / framework / "bin" / "python"
    if framework != "native" and not py.exists():
        pytest.skip(f"{py} missing: run `scripts/make_harness_venvs.sh {framework}`")
    ds = BuiltDataset(locomo_sample / PROFILE[framework])
    lme = next(s.sequence_id for s in ds.tables["sequences"] if s.source == "longmemeval_s")
    gold_of = gold_memories(ds)
    g = SourceGold({framework: ds})
    with StandInServer(lambda body: g(_prompt(body)), embed_fn=minilm_embed) as srv:
        ep = Endpoint(srv.base_url, "gold", "policy", timeout_s=300)
        cfg = HarnessConfig(
            framework=framework,
            scene="chat" if framework == "hy_memory" else "default",
            in_process=framework == "native",
            num_retries=0,
            rpc_timeout_s=900,
            options={"max_tokens": 4096} if framework == "mem0" else {},
            # a LongMemEval evidence turn runs to 2,762 chars; native's default would refuse the op
            native=NativeConfig(max_tokens=4096, max_memory_chars=GOLD_MEMORY_CHARS),
        )
        for seq, n in (("locomo/conv-26", LOCOMO_CHUNKS), (lme, 99)):
            h = make_harness(cfg, ep, ep, sandbox_root=tmp_path / seq, sandbox_id="gold")
            try:
                h.open(tmp_path / seq / "bank", create=True)
                chunks = _chunks(ds, seq, n)
                for c in chunks:
                    res = h.write_chunk(
                        chunk_messages(c), c.session_ids[0], iso_date(c.date), chunk_index=c.index
                    )
                    assert res.status is WriteStatus.OK, res
                stored = [e.text for e in h.read_all()]
            finally:
                h.shutdown() if hasattr(h, "shutdown") else h.close()
            want = [m for c in chunks for m in gold_of.get((seq, c.index), [])]
            assert want, seq
            if framework == "hy_memory":  # it keeps a memory per extraction and collapses white space
                flat = [" ".join(s.split()) for s in stored]
                assert all(any(" ".join(w.split()) in s for s in flat) for w in want), (set(want), stored)
            else:
                assert sorted(stored) == sorted(want)
    assert g.counts.get("unmatched", 0) == 0
