"""The extractive reader (reward/instrument.py): each rule of its grammar, the reader prompt read back
from the chat-templated ids, and the engine serving it behind a real frozen gateway to the real
ChatClient (the path the reward service and the evaluation take)."""

import httpx
import pytest

from data_pipeline.schema import NO_SUCH_RECORD
from harnesses.base import MemoryEntry
from hymem_train.engines.base import SamplingParams
from hymem_train.engines.instrument import InstrumentReaderEngine
from hymem_train.gateway.local_reader import start_instrument_server
from hymem_train.models.tokenizer import default_tokenizer
from reward.config import LlmClientConfig
from reward.eval_protocol import default_reader_messages
from reward.instrument import _same_key, extractive_answer, parse_reader_prompt
from reward.judge import Reader, parse_answer, reader_messages
from reward.llm import ChatClient, ChatRequest, Fault

CITY = "city: Lisbon, then Oslo (2023-01-16), then Lisbon (2023-01-30)"
BANK = [CITY, "allergy: penicillin", "car: blue", "Dog: Rex."]  # one person's bank: keys are attributes


# ---------------------------------------------------------------------------------------- the rules
def test_current_value():
    assert extractive_answer("What is Alice's city?", BANK) == "Lisbon"
    assert extractive_answer("What is Alice's allergy?", BANK) == "penicillin"
    assert extractive_answer("what is  ALICE'S dog?", BANK) == "Rex"  # case, spaces, the record's full stop


def test_history_lists_every_state_in_order():
    assert extractive_answer("How did Alice's city change?", BANK) == "Lisbon; Oslo; Lisbon"
    assert extractive_answer("How did Alice's car change?", BANK) == "blue"  # one state
    assert extractive_answer("How did Alice's job change?", BANK) == NO_SUCH_RECORD


def test_two_keys_in_question_order_and_a_missing_part():
    assert extractive_answer("What are Alice's allergy and car?", BANK) == "penicillin; blue"
    assert extractive_answer("What are Alice's car and allergy?", BANK) == "blue; penicillin"
    assert extractive_answer("What are Alice's car and sport?", BANK) == f"blue; {NO_SUCH_RECORD}"
    assert extractive_answer("What are Alice's sport and job?", BANK) == NO_SUCH_RECORD


def test_contradiction_is_a_hedge_and_duplicates_answer_once():
    contradicted = BANK + ["city: Oslo"]  # a second active fact beside the old state
    assert extractive_answer("What is Alice's city?", contradicted) == "Lisbon or Oslo"
    duplicated = BANK + ["car: blue", "Car:  blue"]
    assert extractive_answer("What is Alice's car?", duplicated) == "blue"
    assert extractive_answer("How did Alice's city change?", contradicted) == "Lisbon; Oslo; Lisbon or Oslo"


def test_no_record_and_unparseable_prose_is_ignored():
    prose = ["Alice said her snack today is popcorn", "Alice's snack is popcorn", "snack: pop corn", "snack:"]
    assert extractive_answer("What is Alice's snack?", BANK + prose) == NO_SUCH_RECORD
    assert extractive_answer("What is Alice's city?", []) == NO_SUCH_RECORD
    assert extractive_answer("What is Alice's city?", prose) == NO_SUCH_RECORD


def test_keys_are_whole_attributes():
    assert extractive_answer("What is Alice's career?", BANK) == NO_SUCH_RECORD  # "car" is not "career"
    bank = ["blood type: O", "type: fast"]
    assert extractive_answer("What is Alice's blood type?", bank) == "O"
    assert extractive_answer("What is Alice's type?", bank) == "fast"
    # a question of another form: the record keys that occur in it, whole words, the longest one
    assert extractive_answer("Tell me Alice's blood type", bank) == "O"
    assert extractive_answer("Which car and city does Alice have", BANK) == "blue; Lisbon"


def test_a_key_naming_its_person_answers_only_for_that_person():
    # the grammar keys a record by its attribute (a bank holds one person); a key that also names a
    # person ("Alice's city") matches questions about that person only
    assert _same_key("city", "alice's city") and _same_key("alice's city", "alice's city")
    assert _same_key("alice's city", "city") and not _same_key("bob's city", "alice's city")
    assert not _same_key("city", "alice's car")


# ------------------------------------------------------------------------------ the prompt read back
@pytest.fixture(scope="module")
def tok():
    return default_tokenizer()


def _entries(texts, date="2023-01-30"):
    return [MemoryEntry(str(i), t, {"date": date} if date else {}) for i, t in enumerate(texts, 1)]


def _decoded(tok, messages):
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return tok.decode(ids, skip_special_tokens=True)


def test_reader_prompt_parses_back_after_the_chat_template(tok):
    q, recs = parse_reader_prompt(_decoded(tok, reader_messages("What is Alice's city?", _entries(BANK))))
    assert q == "What is Alice's city?" and recs == BANK  # the "(date) " prefix is not the record
    q, recs = parse_reader_prompt(_decoded(tok, reader_messages("What is Alice's city?", _entries(BANK, ""))))
    assert recs == BANK
    assert parse_reader_prompt(_decoded(tok, reader_messages("What is X?", []))) == ("What is X?", [])
    # a record with a line break of its own stays one record (prose then: it does not parse)
    q, recs = parse_reader_prompt(
        _decoded(tok, reader_messages("Q?", _entries(["a\nb", "Alice's car: red"])))
    )
    assert recs == ["a\nb", "Alice's car: red"]

    class Item:  # the evaluation's prompt, with the line saying when the question is asked
        question, question_date = "What is Alice's car?", "2023-02-01"

    q, recs = parse_reader_prompt(_decoded(tok, default_reader_messages(Item(), _entries(BANK))))
    assert q == "What is Alice's car?" and recs == BANK


def test_a_prompt_that_is_not_a_reader_prompt_raises_naming_what_is_missing(tok):
    writer = [
        {"role": "system", "content": "You manage a memory bank."},
        {"role": "user", "content": "Existing memories:\n(none)\n\nNew conversation:\nuser: hi"},
    ]
    with pytest.raises(ValueError, match="no 'Memory records:' block and no 'Question:' line"):
        parse_reader_prompt(_decoded(tok, writer))
    with pytest.raises(ValueError, match="no 'Question:' line"):
        parse_reader_prompt("Memory records:\n[1] car: red\n")
    with pytest.raises(ValueError, match="records block starts with"):
        parse_reader_prompt("Memory records:\ncar: red\n\nQuestion: What is Alice's car?")


# ------------------------------------------------------------------------------------------ engine
def test_engine_answers_stops_and_truncates_to_max_tokens(tok):
    eng = InstrumentReaderEngine(tok, max_model_len=4096)
    msgs = reader_messages("How did Alice's city change?", _entries(BANK))
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    full = tok.encode("Lisbon; Oslo; Lisbon", add_special_tokens=False)
    out = eng.generate([ids], [SamplingParams(max_tokens=64)])[0]
    assert out.finish_reason == "stop" and out.response_ids == full + [tok.eos_token_id]
    assert out.logprobs == [0.0] * len(out.response_ids)
    fit = eng.generate([ids], [SamplingParams(max_tokens=len(full) + 1)])[0]
    assert fit.finish_reason == "stop"
    cut = eng.generate([ids], [SamplingParams(max_tokens=len(full))])[0]  # no room for the stop token
    assert cut.finish_reason == "length" and cut.response_ids == full
    two = eng.generate([ids], [SamplingParams(max_tokens=2)])[0]
    assert two.finish_reason == "length" and two.response_ids == full[:2]
    with pytest.raises(NotImplementedError):
        eng.topk_logprobs([ids], 5)
    assert eng.update_weights([], 3) == 0 and eng.policy_version == 3
    bad = tok.encode("user: hello", add_special_tokens=False)
    with pytest.raises(ValueError, match=r"prompt 1 of 2: not a reader prompt"):
        eng.generate([ids, bad], [SamplingParams(), SamplingParams()])


# ---------------------------------------------------------------- end to end: gateway + ChatClient
@pytest.fixture(scope="module")
def server(tok):
    srv = start_instrument_server(tok, served_model_name="reader", max_model_len=2048)
    yield srv
    srv.stop()


def test_reader_through_the_frozen_gateway_answers_from_the_records(server):
    reader = Reader(ChatClient(LlmClientConfig(base_url=server.base_url, model="reader", max_tokens=32)))
    bank = _entries(BANK + ["Alice said she was sleepy"])
    out = reader.answer_all(
        [
            ("p0", "What is Alice's city?", bank),
            ("p1", "How did Alice's city change?", bank),
            ("p2", "What are Alice's allergy and car?", bank),
            ("p3", "What is Alice's mood?", bank),
            ("p4", "What is Alice's city?", []),
        ]
    )
    assert out == ["Lisbon", "Lisbon; Oslo; Lisbon", "penicillin; blue", NO_SUCH_RECORD, NO_SUCH_RECORD]
    assert reader.stats["faults"] == 0


def test_a_writer_request_to_the_reader_fails_loudly_and_alone(server):
    writer = [{"role": "user", "content": "Existing memories:\n(none)\n\nNew conversation:\nuser: hi"}]
    r = httpx.post(f"{server.base_url}/chat/completions", json={"model": "reader", "messages": writer})
    assert r.status_code == 500 and "not a reader prompt" in r.json()["error"]["message"]
    # through the client: the fault names why; a reader prompt in the same round is answered
    cfg = LlmClientConfig(base_url=server.base_url, model="reader", num_retries=0)
    client = ChatClient(cfg)
    got = client.run_batch(
        [
            ChatRequest(writer, parse_answer, "writer call"),
            ChatRequest(reader_messages("What is Alice's car?", _entries(BANK)), parse_answer, "reader call"),
        ]
    )
    assert isinstance(got[0], Fault) and "Memory records" in got[0].detail
    assert got[1] == "blue"
