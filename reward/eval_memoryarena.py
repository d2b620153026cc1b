"""MemoryArena protocols, scored locally with the official rules (docs/evaluation_benchmarks.md).

- Travel SPS (group_travel_planner): per member, the share of its constraint slots, the (day, slot)
  pairs where its gold plan differs from the base person's, whose value in the predicted plan matches
  the gold value (difflib similarity >= 0.7, `travel_planner_env/eval.py`). Members without constraint
  slots do not count, as upstream skips them. Upstream averages members per group, then groups; the cell
  here is the mean over members (the evaluator averages items), so groups of different sizes weigh
  differently. The reason line also says whether the member passes every slot (the official PS).
- Shopping PS (bundled_shopping): per subtask, 1 when the named ASIN is the target ASIN
  (`web_shopping_env/compute_reward.py`'s full-credit case). Its partial credit (attribute, price and
  product-type match of a wrong purchase) needs the WebShop catalog and an attribute judge, and a
  wrong purchase scores 0 here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from data_pipeline.memoryarena import DAY_KEYS, SIM_TH, SLOTS, get_day, similarity
from reward.eval_protocol import Messages, Metric, Verdict, register
from reward.judge import format_memories

TRAVEL_SYSTEM = (
    "You plan trips for a travel group using only the memory records below: the base traveller's plan and "
    "the plans already made for earlier group members. Follow the member's request exactly."
)
TRAVEL_FORMAT = (
    "Reply with the member's complete plan as one JSON list with one object per day, keys "
    + ", ".join(DAY_KEYS)
    + '; use "-" for a slot with nothing planned.'
)
SHOPPING_SYSTEM = (
    "You are a shopping agent. The memory records below hold the shopping rules and the products already "
    "bought for this bundle; use them to choose the product for the current step."
)
SHOPPING_FORMAT = "End your reply with one line: 'ASIN: <the 10-character ASIN of the product to buy>'."
_ASIN = re.compile(r"ASIN:\s*\**\s*([A-Z0-9]{10})\b", re.IGNORECASE)
_ASIN_LOOSE = re.compile(r"\b(B[0-9A-Z]{9})\b")  # Amazon product ASINs start with B


def parse_plan(reply: str) -> list[dict] | None:
    """The first JSON list of day objects in the reply (a fenced block is fine), or None."""
    start, end = reply.find("["), reply.rfind("]")
    if start < 0 or end <= start:
        return None
    try:
        plan = json.loads(reply[start : end + 1])
    except ValueError:
        return None
    if not isinstance(plan, list) or not all(isinstance(d, dict) for d in plan):
        return None
    return plan


def travel_gold(item: Any) -> dict:
    gold = json.loads(item.answer)
    if not isinstance(gold, dict) or "daily_plans" not in gold or "constraint_slots" not in gold:
        raise ValueError(f"{item.item_id}: answer is not the loader's {{daily_plans, constraint_slots}} JSON")
    return gold


def _slot_pass(gold_plan: list[dict], plan: list[dict] | None, day: Any, slot: str) -> bool:
    gold_day, day_plan = get_day(gold_plan, day), get_day(plan, day)
    if not gold_day or not day_plan:
        return False
    return similarity(gold_day.get(slot, "-"), day_plan.get(slot, "-")) >= SIM_TH


def travel_score(item: Any, reply: str) -> Verdict:
    gold = travel_gold(item)
    plan = parse_plan(reply)
    slots = [tuple(s) for s in gold["constraint_slots"]]
    passed = sum(_slot_pass(gold["daily_plans"], plan, day, slot) for day, slot in slots)
    full = plan is not None and all(
        _slot_pass(gold["daily_plans"], plan, d.get("days") or d.get("day"), s)
        for d in gold["daily_plans"]
        for s in SLOTS
    )
    sps = passed / len(slots) if slots else 0.0
    what = "no JSON plan in the reply" if plan is None else f"{passed}/{len(slots)} constraint slots"
    return Verdict(sps, f"{what}; full pass (PS): {full}")


def travel_counts(item: Any) -> bool:
    return bool(travel_gold(item)["constraint_slots"])


def shopping_asin(reply: str) -> str:
    m = _ASIN.search(reply or "") or _ASIN_LOOSE.search((reply or "").upper())
    return m.group(1).upper() if m else ""


def shopping_score(item: Any, reply: str) -> Verdict:
    asin = shopping_asin(reply)
    target = item.answer.strip().upper()
    if not asin:
        return Verdict(0.0, "no ASIN in the reply (no purchase)")
    return Verdict(1.0 if asin == target else 0.0, f"bought {asin}, target {target}")


def _messages(system: str, fmt: str, item: Any, entries: Sequence[Any]) -> Messages:
    user = f"Memory records:\n{format_memories(entries)}\n\nRequest:\n{item.question}\n\n{fmt}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def travel_reader(item: Any, entries: Sequence[Any]) -> Messages:
    return _messages(TRAVEL_SYSTEM, TRAVEL_FORMAT, item, entries)


def shopping_reader(item: Any, entries: Sequence[Any]) -> Messages:
    return _messages(SHOPPING_SYSTEM, SHOPPING_FORMAT, item, entries)


register(
    Metric(
        "memoryarena_travel",
        "Travel SPS",
        counts=travel_counts,
        local=travel_score,
        reader_messages=travel_reader,
        reader_max_tokens=32768,
        reader_budget_source="MemoryArena env/env_systems/travel_planner_env/clients/openai_client.py: "
        "max_tokens 32768 (its Anthropic and Gemini clients: 8192); a whole multi-day JSON plan",
    ),
    Metric(
        "memoryarena_shopping",
        "Shopping PS",
        local=shopping_score,
        reader_messages=shopping_reader,
        reader_max_tokens=4096,
        reader_budget_source="MemoryArena configs/web_shopping_configs/*.json: max_tokens 4096",
    ),
)
