"""Bank metrics (reward/bank_metrics.py) on a hand-written ledger sequence, every value computed by hand;
and the paired bootstrap over sequences."""

import math

import pytest

from data_pipeline.ledger import gold_records
from data_pipeline.schema import Chunk, Turn
from reward.bank_metrics import METRICS, op_counts, paired_bootstrap, sequence_counts

DATES = ("2023-01-02", "2023-01-09", "2023-01-16", "2023-01-23")
LINES = (
    ["My city is Lisbon.", "My dog is Rex.", "My snack today is popcorn."],
    ["Actually, my city is Oslo now.", "Like I said, my dog is Rex.", "Oh, and my job is nurse."],
    ["News: my city is Lisbon now.", "Actually, my job is baker now.", "Right now my mood is sleepy."],
    ["Again, my dog is Rex.", "My sister is Mia."],
)


def chunks():
    """Alice: city Lisbon -> Oslo -> Lisbon (A -> B -> A), dog Rex restated twice, job nurse -> baker,
    sister Mia; two small-talk lines (snack, mood)."""
    out = []
    for t, (date, lines) in enumerate(zip(DATES, LINES, strict=True)):
        turns = [Turn(f"D{t + 1}:1", "Sam", "Hi Alice! What's new?")]
        turns += [Turn(f"D{t + 1}:{i + 2}", "Alice", x) for i, x in enumerate(lines)]
        turns.append(Turn(f"D{t + 1}:{len(turns) + 1}", "Sam", "Nice!"))
        out.append(Chunk(sequence_id="s", index=t, turns=turns, date=date, session_ids=[f"session_{t + 1}"]))
    return out


def values(counts):
    return {m: (n / d if d else None) for m, (n, d) in counts.items()}


def test_gold_bank_scores_perfectly():
    gold = gold_records(chunks())
    assert "city: Lisbon, then Oslo (2023-01-09), then Lisbon (2023-01-16)" in gold
    c = sequence_counts(gold, chunks())
    assert c["memory_recall"] == (4, 4) and c["target_precision"] == (4, 4)
    assert c["false_memory_resistance"] == (2, 2) and c["restated_once"] == (1, 1)
    assert c["update_correct"] == (2, 2) and c["history_kept"] == (2, 2)
    assert c["update_hallucination"] == c["update_omission"] == c["update_history_lost"] == (0, 2)
    assert c["unparsed_share"] == (0, 4) and c["bank_records"] == (4, 1)
    assert c["bank_tokens"] == (2 + 2 + 8 + 5, 1)  # dog, sister, city (8 words), job (5)
    assert not any(m.startswith("op_") for m in c)  # no op counts given


def test_duplicate_contradiction_small_talk_prose_and_a_missed_change():
    bank = [
        "city: Lisbon",  # never updated: right by value (A -> B -> A), but both changes missing
        "dog: Rex",
        "dog: Rex",  # the restatement stored a second time
        "job: nurse",
        "job: baker",  # the change added beside the old record (a contradiction)
        "snack: popcorn",  # stored small talk
        "Alice is feeling sleepy today.",  # prose: does not parse
    ]  # the sister is missing
    c = sequence_counts(bank, chunks())
    assert c["memory_recall"] == (3, 4)  # city, dog, job (baker is in one of the two job records)
    assert c["target_precision"] == (3, 7)  # the duplicate dog, the old job, small talk, prose: not targets
    assert c["false_memory_resistance"] == (1, 2)  # the snack is stored; the mood only in prose
    assert c["restated_once"] == (0, 1)
    assert c["update_omission"] == (2, 2)  # city: a prefix of its states; job: two active records
    assert c["update_correct"] == c["update_hallucination"] == c["history_kept"] == (0, 2)
    assert c["unparsed_share"] == (1, 7)
    assert c["bank_records"] == (7, 1) and c["bank_tokens"] == (2 * 6 + 5, 1)
    assert sequence_counts(bank, chunks(), count_tokens=len)["bank_tokens"] == (sum(map(len, bank)), 1)


def test_update_outcomes():
    bank = [
        "city: Lisbon, then Oslo (2023-01-09)",  # the revert to Lisbon missed: the old state current
        "job: baker",  # overwritten: current right, the earlier state dropped
        "Dog: rex.",  # case and a trailing full stop do not matter
        "sister: Mia",
    ]
    c = sequence_counts(bank, chunks())
    assert c["memory_recall"] == (3, 4) and c["target_precision"] == (3, 4)
    assert c["update_omission"] == (1, 2) and c["update_history_lost"] == (1, 2)
    assert c["update_correct"] == c["update_hallucination"] == c["history_kept"] == (0, 2)
    assert c["false_memory_resistance"] == (2, 2) and c["restated_once"] == (1, 1)

    bank = ["city: Lisbon, then Paris (2023-01-16)", "job: nurse, then baker (2023-01-16)"]
    c = sequence_counts(bank, chunks())
    assert c["update_hallucination"] == (1, 2)  # Paris was never stated for the city
    assert c["update_correct"] == c["history_kept"] == (1, 2)  # dates are not compared
    assert c["memory_recall"] == (1, 4) and c["target_precision"] == (1, 2)


def test_empty_bank_and_op_mix():
    c = sequence_counts([], chunks(), ops={"ADD": 0})
    assert c["memory_recall"] == (0, 4) and c["target_precision"] == (0, 0)
    assert c["false_memory_resistance"] == (2, 2) and c["restated_once"] == (0, 1)
    assert c["update_omission"] == (2, 2) and c["bank_records"] == (0, 1)
    assert c["op_add"] == (0, 0)
    writes = [
        {"status": "ok", "num_added": 2, "num_updated": 0, "num_deleted": 0},
        {"status": "ok", "num_added": 0, "num_updated": 1, "num_deleted": 1},
        {"status": "ok", "num_added": 0, "num_updated": 0, "num_deleted": 0},  # a NONE reply
        {"status": "policy_error", "num_added": 0, "num_updated": 0, "num_deleted": 0},
        {"status": "platform_error", "num_added": 0, "num_updated": 0, "num_deleted": 0},  # not counted
    ]
    ops = op_counts(writes)
    assert ops == {"ADD": 2, "UPDATE": 1, "DELETE": 1, "NONE": 1, "INVALID": 1}
    c = sequence_counts(gold_records(chunks()), chunks(), ops=ops)
    assert c["op_add"] == (2, 6) and c["op_none"] == (1, 6) and c["op_invalid"] == (1, 6)
    assert set(c) == set(METRICS)


def synthetic_writers(n=12):
    """Writer b stores exactly one more of ~6 gold facts than writer a on every sequence; a's own count
    swings between almost nothing and almost everything from sequence to sequence."""
    a, b = {}, {}
    for i in range(n):
        den = 5 + i % 3
        k = 0 if i % 2 else den - 1
        a[f"s{i:02d}"] = {"memory_recall": (k, den), "bank_records": (k, 1)}
        b[f"s{i:02d}"] = {"memory_recall": (k + 1, den), "bank_records": (k + 1, 1)}
    return {"a": a, "b": b}


def test_paired_bootstrap_detects_a_small_consistent_difference():
    pw = synthetic_writers()
    paired = paired_bootstrap(pw, pairs=[("b", "a")], resamples=2000, seed=3)
    unpaired = paired_bootstrap(pw, pairs=[("b", "a")], resamples=2000, seed=3, paired=False)
    num_a = sum(c["memory_recall"][0] for c in pw["a"].values())
    den = sum(c["memory_recall"][1] for c in pw["a"].values())
    assert paired.pooled["a"]["memory_recall"].value == pytest.approx(num_a / den)
    d = paired.diffs[("b", "a")]["memory_recall"]
    assert d.value == pytest.approx(12 / den) and d.lo > 0  # paired: the interval excludes 0
    u = unpaired.diffs[("b", "a")]["memory_recall"]
    assert u.value == pytest.approx(d.value) and u.lo < 0 < u.hi  # independent draws: it does not
    assert paired.diffs[("b", "a")]["bank_records"].lo == pytest.approx(1.0)  # +1 record on every draw
    a = paired.pooled["a"]["memory_recall"]
    assert a.lo < a.value < a.hi
    # seeded and deterministic
    again = paired_bootstrap(pw, pairs=[("b", "a")], resamples=2000, seed=3)
    assert again.diffs == paired.diffs and again.pooled == paired.pooled


def test_paired_bootstrap_edges():
    pw = synthetic_writers(4)
    pw["b"].pop("s00")
    with pytest.raises(ValueError, match="other sequences"):
        paired_bootstrap(pw)
    zero = {"w": {"s": {"target_precision": (0, 0)}}}  # an empty bank: precision undefined
    r = paired_bootstrap(zero, resamples=10)
    p = r.pooled["w"]["target_precision"]
    assert math.isnan(p.value) and math.isnan(p.lo)
