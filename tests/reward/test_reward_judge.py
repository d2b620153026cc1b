"""Reader / judge clients against the stand-in OpenAI server on 127.0.0.1: strict parsing, bounded
retries, faults excluded and counted; the exact-match scorer's refusal."""

import pytest

from data_pipeline.schema import Manifest
from harnesses.base import MemoryEntry
from reward.config import LlmClientConfig
from reward.judge import (
    ExactMatchScorer,
    LlmJudge,
    OrmVerdict,
    ProbeItem,
    QuestionItem,
    Reader,
    parse_orm_verdict,
    parse_probe_verdict,
)
from reward.llm import ChatClient, EndpointError, Fault, ParseError
from tests.doubles.openai_server import HttpFailure, StandInServer, usage


def client(srv, **kw):
    base = dict(base_url=srv.base_url, model="judge", timeout_s=5.0, num_retries=2, retry_backoff_s=0.0)
    base.update(kw)
    return ChatClient(LlmClientConfig(**base))


PROBE = ProbeItem(
    "probe p0 / rollout 0", "Where does Ana work?", "at a bakery", "full credit if bakery", "a bakery"
)
QUESTION = QuestionItem(
    "question q0 / rollout 0",
    "Pets?",
    "a dog and a cat",
    ["Ana has a dog", "Ana has a cat"],
    "rubric",
    "a dog",
)


# --- strict parsing (golden)


@pytest.mark.parametrize(
    "text,want",
    [
        ('{"score": 0.75}', 0.75),
        ('  {"score": 1}\n', 1.0),
        ('```json\n{"score": 0}\n```', 0.0),
        ('{"score": 0.5, "reason": "partial"}', 0.5),
    ],
)
def test_probe_verdict_accepts(text, want):
    assert parse_probe_verdict(text) == want


@pytest.mark.parametrize(
    "text",
    [
        "score: 0.5",
        '{"score": 1.5}',
        '{"score": -0.1}',
        '{"score": "0.5"}',
        '{"score": true}',
        '{"score": NaN}',
        '{"grade": 0.5}',
        '{"score": 0.5, "verdict": "yes"}',
        "[0.5]",
        'Sure! {"score": 0.5}',
        "",
    ],
)
def test_probe_verdict_rejects(text):
    with pytest.raises(ParseError):
        parse_probe_verdict(text)


def test_orm_verdict_accepts_and_maps_fact_numbers():
    v = parse_orm_verdict('{"score": 0.5, "recovered": [1, 3]}', 3)
    assert v == OrmVerdict(0.5, [True, False, True])
    assert parse_orm_verdict('{"score": 0, "recovered": []}', 2).recovered_F == [False, False]


@pytest.mark.parametrize(
    "text",
    [
        '{"score": 0.5}',
        '{"score": 0.5, "recovered": [0]}',
        '{"score": 0.5, "recovered": [4]}',
        '{"score": 0.5, "recovered": [1, 1]}',
        '{"score": 0.5, "recovered": ["1"]}',
        '{"score": 0.5, "recovered": 1}',
    ],
)
def test_orm_verdict_rejects(text):
    with pytest.raises(ParseError):
        parse_orm_verdict(text, 3)


# --- clients over HTTP


def test_reader_sees_question_and_memories_only():
    with StandInServer(replies=["at a bakery"]) as srv:
        reader = Reader(client(srv))
        entries = [MemoryEntry("1", "Ana works at a bakery", {"date": "2023-05-01"})]
        out = reader.answer_all([("probe p0", "Where does Ana work?", entries), ("probe p1", "Pets?", [])])
        assert out == ["at a bakery", "at a bakery"]
        users = {
            r.body["messages"][1]["content"].rsplit("Question: ", 1)[1]: r.body["messages"][1]["content"]
            for r in srv.chat_requests()
        }  # concurrent: arrival order is not request order
    user = users["Where does Ana work?"]
    assert "Ana works at a bakery" in user and "(2023-05-01)" in user
    assert "(no records)" in users["Pets?"]


def test_judge_receives_rubric_and_gold_facts_and_parses():
    with StandInServer(replies=['{"score": 1.0}', '{"score": 0.5, "recovered": [1]}']) as srv:
        judge = LlmJudge(client(srv))
        assert judge.score_probes([PROBE]) == [1.0]
        assert judge.score_questions([QUESTION]) == [OrmVerdict(0.5, [True, False])]
        bodies = [r.body for r in srv.chat_requests()]  # two sequential batches: order is known
    assert "full credit if bakery" in bodies[0]["messages"][1]["content"]
    assert "1. Ana has a dog\n2. Ana has a cat" in bodies[1]["messages"][1]["content"]


def test_garbage_then_valid_reply_is_retried_and_kept():
    with StandInServer(replies=["I think it is good", '{"score": 0.8}']) as srv:
        c = client(srv)
        assert LlmJudge(c).score_probes([PROBE]) == [0.8]
    assert c.stats["calls"] == 2 and c.stats["retries"] == 1 and c.stats["faults"] == 0


def test_usage_tokens_are_counted_for_every_answered_attempt():
    # the endpoint's `usage` (the stand-in counts whitespace words); a reply that then failed to parse
    # was still paid for, so its tokens count too
    with StandInServer(replies=["I think it is good", '{"score": 0.8}']) as srv:
        c = client(srv)
        assert LlmJudge(c).score_probes([PROBE]) == [0.8]
        bodies = [r.body for r in srv.chat_requests()]
    prompt = sum(usage(b, "")["prompt_tokens"] for b in bodies)
    assert len(bodies) == 2 and prompt > 0 and c.stats["prompt_tokens"] == prompt
    assert c.stats["completion_tokens"] == 5 + 2  # "I think it is good" + '{"score": 0.8}'


def test_timeout_and_garbage_exhaust_retries_then_fault_counted():
    # attempt 1 times out (server sleeps past the 0.3 s client timeout), attempts 2-3 are garbage
    replies = [HttpFailure(500, delay_s=1.0), "not json", '{"score": 7}']
    with StandInServer(replies=replies) as srv:
        c = client(srv, timeout_s=0.3)
        out = LlmJudge(c).score_probes([PROBE])
    assert isinstance(out[0], Fault) and out[0].kind == "parse" and out[0].num_attempts == 3
    assert "probe p0 / rollout 0" in out[0].detail
    assert c.stats["calls"] == 3 and c.stats["retries"] == 2 and c.stats["faults/parse"] == 1


def test_persistent_timeouts_become_a_timeout_fault():
    with StandInServer(replies=[HttpFailure(500, delay_s=1.0)]) as srv:
        c = client(srv, timeout_s=0.2, num_retries=1)
        out = LlmJudge(c).score_questions([QUESTION])
    assert isinstance(out[0], Fault) and out[0].kind == "timeout" and out[0].num_attempts == 2
    assert c.stats["faults/timeout"] == 1


def test_server_error_retried_bad_request_not_retried():
    with StandInServer(replies=[HttpFailure(503), '{"score": 0.25}']) as srv:
        c = client(srv)
        assert LlmJudge(c).score_probes([PROBE]) == [0.25]
        assert c.stats["retries"] == 1
    with StandInServer(replies=[HttpFailure(400, body="prompt too long")]) as srv:
        c = client(srv)
        out = LlmJudge(c).score_probes([PROBE])
        assert isinstance(out[0], Fault) and out[0].kind == "http_400" and out[0].num_attempts == 1
        assert len(srv.chat_requests(status=None)) == 1


def test_misconfigured_endpoint_raises_instead_of_excluding():
    with StandInServer(replies=['{"score": 1}'], allowed_keys={"right-key"}) as srv:
        c = client(srv, api_key="wrong-key")
        with pytest.raises(EndpointError, match="HTTP 401"):
            LlmJudge(c).score_probes([PROBE])


def test_batch_keeps_order_under_concurrency():
    def reply(body):
        q = body["messages"][1]["content"]
        return '{"score": 1.0}' if "Q-even" in q else '{"score": 0.0}'

    items = [
        ProbeItem(f"p{i}", f"Q-{'even' if i % 2 == 0 else 'odd'} {i}", "r", "rub", "a") for i in range(20)
    ]
    with StandInServer(replies=reply) as srv:
        out = LlmJudge(client(srv, max_concurrency=8)).score_probes(items)
    assert out == [1.0 if i % 2 == 0 else 0.0 for i in range(20)]


# --- exact match


def test_exact_match_refuses_datasets_not_declared_atomic():
    with pytest.raises(ValueError, match="answers_atomic"):
        ExactMatchScorer(Manifest(name="locomo_train", sources=["locomo"]))
    with pytest.raises(ValueError, match="answers_atomic"):
        ExactMatchScorer(object())


def test_exact_match_on_atomic_dataset():
    s = ExactMatchScorer(Manifest(name="synth", sources=["synthetic"], answers_atomic=True))
    items = [
        ProbeItem("a", "q", "Paris", "", "paris."),
        ProbeItem("b", "q", "Paris", "", "in Paris"),
        ProbeItem("c", "q", "no such record", "", "No such record"),
    ]
    assert s.score_probes(items) == [1.0, 0.0, 1.0]
    q = QuestionItem("q", "q", "blue", ["x is blue"], "", " Blue ")
    assert s.score_questions([q]) == [OrmVerdict(1.0, [True])]


HISTORY = ["Alice's city: Lisbon", "Alice's city: Oslo", "Alice's city: Lisbon again"]


def _orm(answer, reference="Lisbon; Oslo; Lisbon", facts=HISTORY, gold_answers=("Lisbon", "Oslo", "Lisbon")):
    s = ExactMatchScorer(Manifest(name="synth", sources=["synthetic"], answers_atomic=True))
    return s.score_questions(
        [QuestionItem("q", "q", reference, list(facts), "", answer, list(gold_answers))]
    )[0]


def test_exact_match_orm_credits_each_gold_fact_golden_values():
    # worked by hand: gold states (Lisbon, Oslo, Lisbon); the answer's ";" parts aligned in order
    assert _orm("Lisbon; Oslo; Lisbon") == OrmVerdict(1.0, [True, True, True])
    assert _orm("Oslo; Lisbon") == OrmVerdict(2 / 3, [False, True, True])  # the first state lost
    assert _orm("lisbon.") == OrmVerdict(
        1 / 3, [False, False, True]
    )  # the current state alone: the last fact
    assert _orm("Lisbon; Oslo") == OrmVerdict(2 / 3, [True, True, False])  # the revert lost
    assert _orm("Lisbon; Denver; Lisbon") == OrmVerdict(2 / 3, [True, False, True])
    assert _orm("Oslo; Oslo") == OrmVerdict(1 / 3, [False, True, False])
    assert _orm("Lisbon or Oslo") == OrmVerdict(0.0, [False, False, False])  # a hedge states nothing
    assert _orm("no such record") == OrmVerdict(0.0, [False, False, False])
    # two keys: "penicillin; blue", one recovered
    pair = {
        "reference": "penicillin; blue",
        "facts": ["allergy", "car"],
        "gold_answers": ("penicillin", "blue"),
    }
    assert _orm("penicillin; no such record", **pair) == OrmVerdict(0.5, [True, False])
    assert _orm("blue; penicillin", **pair) == OrmVerdict(0.5, [False, True])  # out of order: one aligns


def test_exact_match_orm_is_all_or_nothing_when_the_reference_is_not_its_facts_answers():
    # the templated world's "before it became" question: one answer standing for two facts
    before = {"reference": "baker", "facts": ["job baker", "job nurse"], "gold_answers": ("baker", "nurse")}
    assert _orm("baker", **before) == OrmVerdict(1.0, [True, True])
    assert _orm("nurse", **before) == OrmVerdict(0.0, [False, False])
    # a gold fact without a known answer span: the old rule
    unknown = {"reference": "a bakery; Rex", "facts": ["works", "dog"], "gold_answers": ("", "")}
    assert _orm("a bakery", **unknown) == OrmVerdict(0.0, [False, False])
    assert _orm("A bakery; rex", **unknown) == OrmVerdict(1.0, [True, True])
    # no gold answers given: the reference's parts, one per fact, are the gold answers
    assert _orm("Rex", reference="a bakery; Rex", facts=["works", "dog"], gold_answers=()) == OrmVerdict(
        0.5, [False, True]
    )
