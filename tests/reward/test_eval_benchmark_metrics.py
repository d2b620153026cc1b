"""PersonaMem-v2 and MemoryArena metrics: the published scoring rules on the fixture items."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from data_pipeline.memoryarena import load_memoryarena
from data_pipeline.personamem import load_personamem_v2
from reward import eval_memoryarena, eval_personamem
from reward.eval_protocol import metric_for

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "eval_benchmarks"


@dataclass
class Entry:  # harnesses.base.MemoryEntry's fields the reader prompt reads
    text: str
    metadata: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def pm_item():
    return load_personamem_v2(FIX / "personamem_v2" / "benchmark" / "text" / "benchmark.csv").eval_items[0]


@pytest.fixture(scope="module")
def travel_items():
    return load_memoryarena(FIX / "memoryarena", "group_travel_planner").eval_items


@pytest.fixture(scope="module")
def shop_items():
    return load_memoryarena(FIX / "memoryarena", "bundled_shopping").eval_items


def test_metrics_are_registered_with_their_columns():
    assert metric_for("personamem_v2").column == "PersonaMem-v2"
    assert metric_for("memoryarena_travel").column == "Travel SPS"
    assert metric_for("memoryarena_shopping").column == "Shopping PS"
    for b in ("personamem_v2", "memoryarena_travel", "memoryarena_shopping"):
        m = metric_for(b)
        assert m.local is not None and m.judge_messages is None and m.reader_messages is not None


# ----------------------------------------------------------------------------------------- PersonaMem


def test_personamem_final_answer_patterns():
    f = eval_personamem.extract_final_answer
    assert f("Reasoning...\nFinal Answer: c") == "C"
    assert f("final answer: B") == "B"
    assert f("The answer: D because") == "D"
    assert f("I pick\nA.") == "A"
    assert f("no idea") == ""


def test_personamem_scores_the_option_letter(pm_item):
    right = pm_item.answer[0]
    wrong = next(c for c in "ABCD" if c != right)
    m = metric_for("personamem_v2")
    assert m.local(pm_item, f"Because of the allergy.\nFinal Answer: {right}").score == 1.0
    assert m.local(pm_item, f"Final Answer: {wrong}").score == 0.0
    v = m.local(pm_item, "I cannot tell.")
    assert v.score == 0.0 and "no option letter" in v.reason


def test_personamem_reader_prompt_carries_records_and_options(pm_item):
    msgs = metric_for("personamem_v2").reader_prompt(
        pm_item, [Entry("User has a pollen allergy", {"date": ""})]
    )
    assert msgs[0]["role"] == "system" and "personalized" in msgs[0]["content"]
    assert "[1] User has a pollen allergy" in msgs[1]["content"]
    assert pm_item.question in msgs[1]["content"]


# ----------------------------------------------------------------------------------------- MemoryArena


def _plan_with(item, changes):
    plan = [dict(d) for d in json.loads(item.answer)["daily_plans"]]
    for (day, slot), value in changes.items():
        plan[day - 1][slot] = value
    return plan


def test_travel_sps_is_the_constraint_slot_pass_rate(travel_items):
    m = metric_for("memoryarena_travel")
    emma = travel_items[1]  # constraint slots (1, dinner) and (2, breakfast)
    perfect = json.dumps(_plan_with(emma, {}))
    assert m.local(emma, f"```json\n{perfect}\n```").score == 1.0
    assert "full pass (PS): True" in m.local(emma, perfect).reason
    half = json.dumps(_plan_with(emma, {(2, "breakfast"): "Dial A Cake"}))
    v = m.local(emma, half)
    assert v.score == 0.5 and "1/2 constraint slots" in v.reason and "full pass (PS): False" in v.reason
    # a non-constraint slot that differs does not lower SPS, only the full pass
    other = json.dumps(_plan_with(emma, {(2, "attraction"): "Anderson Japanese Gardens"}))
    v = m.local(emma, other)
    assert v.score == 1.0 and "full pass (PS): False" in v.reason
    assert m.local(emma, "Sorry, I cannot plan this.").score == 0.0


def test_travel_similarity_threshold_tolerates_small_differences(travel_items):
    eric = travel_items[0]  # (2, dinner) = "Gupta's Rasoi, Rockford"
    close = json.dumps(_plan_with(eric, {(2, "dinner"): "Guptas Rasoi, Rockford"}))
    assert metric_for("memoryarena_travel").local(eric, close).score == 1.0


def test_travel_members_without_constraints_do_not_count(travel_items):
    m = metric_for("memoryarena_travel")
    assert [m.counts(it) for it in travel_items] == [True, True, False]


def test_travel_reader_asks_for_the_json_plan(travel_items):
    msgs = eval_memoryarena.travel_reader(travel_items[0], [Entry("Jennifer day 2 dinner: Cafe Southall")])
    assert "JSON list" in msgs[1]["content"] and travel_items[0].question in msgs[1]["content"]


def test_shopping_ps_is_exact_asin_match(shop_items):
    m = metric_for("memoryarena_shopping")
    item = shop_items[1]  # target B08957C9ZH
    assert m.local(item, "Compatible with the gluten-free mix.\nASIN: b08957c9zh").score == 1.0
    assert m.local(item, "I would buy B08957C9ZH.").score == 1.0
    assert m.local(item, "ASIN: B00TUDFEW2").score == 0.0
    v = m.local(item, "I could not find it")
    assert v.score == 0.0 and "no ASIN" in v.reason
    assert "ASIN:" in eval_memoryarena.shopping_reader(item, [])[1]["content"]
