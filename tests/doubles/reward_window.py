"""Test support for the reward service (used by tests/reward and usable by the rollout tests): a
two-chunk window with probes, a trap and an ORM question, banks written on the native harness
through its real write path, and scripted reader / judge replies for
`tests.doubles.openai_server.StandInServer`.

`build_group` writes each rollout's chunks with a scripted policy (the stand-in plays the gateway)
and, after each chunk, closes the bank and forks it into a snapshot directory, as the rollout code
will do. The judge double decides by keywords: it plays a semantic judge whose verdicts a test fixes
by hand. It is a test double only; real scoring puts semantic conditions in the rubric and the
judge model (silent failure string-rule-scoring).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from data_pipeline.schema import GoldFact, OrmQuestion, Probe, ProbeKind, Window
from harnesses.base import Endpoint, count_tokens
from harnesses.native import NativeHarness
from reward.records import ChunkSnapshot, RolloutGroup, RolloutRecord
from reward.scoring import GrowthBounds, ScoringConfig
from tests.doubles.openai_server import StandInServer

SEQ = "synth/000"
WINDOW = Window(sequence_id=SEQ, index=0, chunk_indices=[0, 1])
CHUNKS = [
    [{"role": "user", "content": "I started a job at a bakery. Also I had pancakes for breakfast today."}],
    [{"role": "user", "content": "We adopted a dog, his name is Rex. Nice weather, by the way."}],
]
POLICIES = {
    "facts": [["Ana works at a bakery"], ["Ana has a dog named Rex"]],
    "chitchat": [["Ana ate pancakes for breakfast today"], ["Ana said the weather is nice"]],
    "nothing": [[], []],
    # the bakery fact again in chunk 1: a leave-out of chunk 0 alone loses nothing (counterfactual ORM)
    "restated": [["Ana works at a bakery"], ["Ana works at a bakery", "Ana has a dog named Rex"]],
}


def probes() -> list[Probe]:
    return [
        Probe(
            f"{SEQ}/c0000/p000",
            SEQ,
            0,
            ProbeKind.PLAIN_RECALL,
            "Where does Ana work?",
            "at a bakery",
            "Full credit if the answer says Ana works at a bakery.",
        ),
        Probe(
            f"{SEQ}/c0000/p001",
            SEQ,
            0,
            ProbeKind.SHOULD_NOT_STORE,
            "What did Ana eat for breakfast today?",
            "no such record",
            "Full credit if the answer has no breakfast record.",
            is_trap=True,
        ),
        Probe(
            f"{SEQ}/c0001/p000",
            SEQ,
            1,
            ProbeKind.SPECIFICITY,
            "What is the name of Ana's dog?",
            "Rex",
            "Full credit if the answer names the dog Rex.",
        ),
    ]


def questions() -> list[OrmQuestion]:
    return [
        OrmQuestion(
            f"{SEQ}/w0000/q000",
            SEQ,
            0,
            "Where does Ana work and what is her dog called?",
            "a bakery; Rex",
            [0, 1],
            [GoldFact("Ana works at a bakery", 0), GoldFact("Ana's dog is named Rex", 1)],
            "One point per fact recovered.",
        ),
    ]


# keyword the judge double looks for, per probe question (trap: the keyword must be absent)
PROBE_KEYS = {
    "Where does Ana work?": "bakery",
    "What is the name of Ana's dog?": "rex",
    "What did Ana eat for breakfast today?": "pancakes",
}
FACT_KEYS = {"Ana works at a bakery": "bakery", "Ana's dog is named Rex": "rex"}


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def write_rollout(root: Path, name: str, ops_per_chunk: list[list[str]], srv: StandInServer) -> RolloutRecord:
    """Write the window's chunks into a fresh bank; snapshot (fork) after each chunk."""
    llm = Endpoint(base_url=srv.base_url, api_key=f"traj-{name}", model="policy", timeout_s=10.0)
    h = NativeHarness(llm)
    work = root / name / "work"
    h.open(work, create=True)
    snaps = []
    for t, (msgs, texts) in enumerate(zip(CHUNKS, ops_per_chunk, strict=True)):
        ops = [{"op": "ADD", "text": x} for x in texts] or [{"op": "NONE"}]
        srv.set_replies([json.dumps({"ops": ops})])
        res = h.write_chunk(msgs, session_id="s1", date=f"2024-01-0{t + 1}", chunk_index=t)
        if not res.ok:
            raise RuntimeError(f"reward_window: rollout {name} chunk {t}: native write failed: {res}")
        size = sum(count_tokens(words, e.text) for e in h.read_all())
        h.close()
        snap = root / name / f"after_c{t}"
        h.fork(work, [snap])
        h.open(work)
        snaps.append(
            ChunkSnapshot(chunk_index=t, bank_dir=str(snap), size_tokens=size, status=res.status.value)
        )
    h.shutdown()
    return RolloutRecord(trajectory_id=f"traj-{name}", chunks=snaps, segment_chunks=[0, 1])


def build_group(root: Path, names: list[str]) -> RolloutGroup:
    with StandInServer() as srv:
        rollouts = [write_rollout(root, n, POLICIES[n], srv) for n in names]
    return RolloutGroup(WINDOW, "native", 0, rollouts, probes(), questions())


def scoring_config(**kw) -> ScoringConfig:
    return ScoringConfig(growth_bounds={"native": GrowthBounds(lower=1.0, upper=3.0, floor_tokens=4)}, **kw)


def _user(body) -> str:
    return body["messages"][1]["content"]


def reader_reply(body) -> str:
    """Reader double: repeats the retrieved records, or says nothing is stored."""
    text = _user(body)
    recs = re.findall(r"^\[\d+\] (?:\([^)]*\) )?(.*)$", text, flags=re.M)
    return "; ".join(recs) if recs else "no such record"


def judge_reply(body) -> str:
    text = _user(body)
    question = re.search(r"^Question: (.*)$", text, flags=re.M).group(1)
    answer = re.search(r"^Candidate answer: (.*)$", text, flags=re.M).group(1).lower()
    if "Gold facts:" in text:
        facts = re.findall(r"^(\d+)\. (.*)$", text, flags=re.M)
        rec = [int(n) for n, f in facts if FACT_KEYS[f] in answer]
        return json.dumps({"score": len(rec) / len(facts), "recovered": rec})
    key = PROBE_KEYS[question]
    hit = key in answer
    trap = "Reference answer: no such record" in text
    return json.dumps({"score": float(hit != trap)})
