"""The lexical reader (reward/lexical.py): its rules, one by one, and its reader-prompt path behind the
frozen gateway (reader_kind=lexical)."""

import pytest

from data_pipeline.schema import NO_SUCH_RECORD
from hymem_train.engines.instrument import INSTRUMENTS, InstrumentReaderEngine
from hymem_train.run_config import READER_KINDS, check_reader_kind
from reward.eval_protocol import default_reader_messages
from reward.instrument import parse_reader_entries
from reward.lexical import content_words, lexical_answer, split_date

SUPPORT = "Caroline attended an LGBTQ support group recently. (said on 8 May 2023)"
PAINT = "Melanie painted a lake sunrise last year. (said on 8 May 2023)"


def test_no_records_or_no_shared_word_is_no_such_record():
    assert lexical_answer("What did Melanie paint?", []) == NO_SUCH_RECORD
    # only stop words in common ("what", "did", "the"): the bank does not answer
    assert lexical_answer("What did the dog eat?", [("", PAINT)]) == NO_SUCH_RECORD


def test_the_record_with_the_most_question_words_answers_minus_the_question():
    recs = [("", SUPPORT), ("", PAINT)]
    assert lexical_answer("What did Melanie paint?", recs) == "a lake sunrise last year."
    # stems compare: "painted" / "paint", "groups" / "group"
    assert content_words("painted groups") == content_words("paint group")
    # a tie goes to the earlier (better retrieved) record
    assert lexical_answer("What about Caroline or Melanie?", recs).startswith("attended")


def test_time_question_answers_the_record_date():
    recs = [("", PAINT), ("", SUPPORT)]
    assert lexical_answer("When did Caroline go to the LGBTQ support group?", recs) == "8 May 2023"
    assert lexical_answer("What year did Melanie paint the sunrise?", recs) == "8 May 2023"
    # no date anywhere: the record's words are the answer
    assert (
        lexical_answer("When did Melanie paint?", [("", "Melanie painted a lake sunrise")])
        == "a lake sunrise"
    )


def test_dates_from_the_suffix_the_entry_or_a_when_line():
    assert split_date("2023-05-08", "x (said on 9 June 2023)") == ("9 June 2023", "x")
    assert split_date("2023-05-08", "x") == ("2023-05-08", "x")
    # hy-memory's search results: "Memory: <text>\nWhen: <date>"
    assert split_date("", "Memory: Caroline paints\nWhen: 2023-05-08 13:56:00") == (
        "2023-05-08 13:56:00",
        "Caroline paints",
    )


def test_lexical_reader_through_the_reader_prompt():
    """The reader prompt of the evaluation (records with their harness dates) decodes to the same answer."""

    class Item:
        question = "When did Caroline go to the support group?"
        question_date = "2023/06/01"

    class Entry:
        def __init__(self, text, date=""):
            self.text, self.metadata = text, {"date": date} if date else {}

    from hymem_train.models.tokenizer import default_tokenizer

    tok = default_tokenizer()
    msgs = default_reader_messages(
        Item(), [Entry(PAINT), Entry("Caroline went to a support group", "2023-05-07")]
    )
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) else ids
    q, entries = parse_reader_entries(tok.decode(ids, skip_special_tokens=True))
    assert q == Item.question and entries[1] == ("2023-05-07", "Caroline went to a support group")
    assert InstrumentReaderEngine(tok, kind="lexical").answer(ids) == "2023-05-07"


def test_reader_kinds_are_the_instruments():
    assert set(READER_KINDS) == {"model", *INSTRUMENTS}
    with pytest.raises(ValueError, match="reader_kind=lexical is served in this process"):
        check_reader_kind("lexical", local_reader=False)
    with pytest.raises(ValueError, match="instrument reader 'bogus'"):
        InstrumentReaderEngine(None, kind="bogus")
