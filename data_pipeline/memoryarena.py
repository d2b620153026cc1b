"""MemoryArena loader (group_travel_planner, bundled_shopping) -> Sequences + EvalItems.

Published layout (docs/evaluation_benchmarks.md): Hugging Face dataset `ZexueHe/memoryarena`, one config
per task, `<task>/*.jsonl`, one agentic task per line: `id` (int), `questions` (list of subtask prompts,
in the order they are solved), `answers` (one gold result per subtask), and
- group_travel_planner: `base_person` {`name`, `query`, `daily_plans`}; each answer is a member's
  `daily_plans` list of {`days`, `current_city`, `transportation`, `breakfast`, `attraction`, `lunch`,
  `dinner`, `accommodation`} (the official eval also accepts `day`);
- bundled_shopping: `category` ("baking_item_0"); each answer is {`target_asin`, `attributes`}.

MemoryArena is agentic: subtask k is solved after subtasks 0..k-1, and their results are what the
memory must carry. Reduced to "bank then question" without leaking later answers, subtask k gets its own
Sequence holding the task background and subtasks 0..k-1 with their gold results (the official shopping
runner also feeds gold purchases back as "Purchase History"); the question is subtask k's prompt.
What this reduction loses is written down in docs/evaluation_benchmarks.md.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

from data_pipeline.loaders import LoadResult
from data_pipeline.schema import EvalItem, RecordError, Sequence, Session, Turn

TASKS = {"group_travel_planner": "memoryarena_travel", "bundled_shopping": "memoryarena_shopping"}
# official travel eval (travel_planner_env/eval.py): the scored slots and the difflib match threshold
SLOTS = ("breakfast", "lunch", "dinner", "accommodation", "transportation", "attraction")
DAY_KEYS = (
    "days",
    "current_city",
    "transportation",
    "breakfast",
    "attraction",
    "lunch",
    "dinner",
    "accommodation",
)
SIM_TH = 0.7


def load_memoryarena(path: str | Path, task: str, source: str | None = None) -> LoadResult:
    """`path`: one `<task>/*.jsonl` file, or a folder holding them (or holding the `<task>/` folder)."""
    if task not in TASKS:
        raise ValueError(f"memoryarena: task {task!r} not in {sorted(TASKS)}")
    source = source or TASKS[task]
    out = LoadResult()
    for file in _files(Path(path), task):
        for lineno, rec in _records(file):
            where = f"{file}:{lineno} (task id {rec.get('id', '?')!r})"
            if task == "group_travel_planner":
                _travel(rec, where, source, out)
            else:
                _shopping(rec, where, source, out)
    return out


def load_memoryarena_travel(path: str | Path, source: str = "memoryarena_travel") -> LoadResult:
    return load_memoryarena(path, "group_travel_planner", source)


def load_memoryarena_shopping(path: str | Path, source: str = "memoryarena_shopping") -> LoadResult:
    return load_memoryarena(path, "bundled_shopping", source)


# ---------------------------------------------------------------------------------------------------
# official travel scoring pieces, shared with reward/eval_memoryarena.py


def similarity(a: Any, b: Any) -> float:
    """The official slot similarity: difflib ratio of the lower-cased values cut to the shorter length."""
    if not a or not b:
        return 0.0
    a, b = str(a).strip().lower(), str(b).strip().lower()
    if a == "-" and b == "-":
        return 1.0
    m = min(len(a), len(b))
    return difflib.SequenceMatcher(None, a[:m], b[:m]).ratio() if m else 0.0


def day_index(day: dict) -> Any:
    return day.get("days") or day.get("day")


def get_day(plan: list[dict] | None, idx: Any) -> dict | None:
    for d in plan or []:
        if isinstance(d, dict) and (d.get("day") == idx or d.get("days") == idx):
            return d
    return None


def constraint_slots(base_plan: list[dict], plan: list[dict]) -> list[tuple[Any, str]]:
    """(day, slot) pairs where the member's gold plan differs from the base person's: the slots the
    official SPS scores (the member's added constraints)."""
    out = []
    for d in plan:
        base = get_day(base_plan, day_index(d))
        if base is None:
            continue
        out += [(day_index(d), s) for s in SLOTS if similarity(base.get(s, "-"), d.get(s, "-")) < SIM_TH]
    return out


# ---------------------------------------------------------------------------------------------------


def _files(path: Path, task: str) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise RecordError(f"{path}: no such file or folder")
    folder = path / task if (path / task).is_dir() else path
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise RecordError(f"{folder}: holds no *.jsonl file (MemoryArena layout: {task}/*.jsonl)")
    return files


def _records(file: Path) -> list[tuple[int, dict]]:
    out = []
    for lineno, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise RecordError(f"{file}:{lineno}: not valid JSON (truncated?): {e.msg}") from None
        if not isinstance(rec, dict):
            raise RecordError(f"{file}:{lineno}: a line must be a JSON object")
        out.append((lineno, rec))
    return out


def _need(obj: dict, key: str, types: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise RecordError(f"{where}: missing field '{key}'")
    v = obj[key]
    if not isinstance(v, types) or isinstance(v, bool):
        want = "/".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise RecordError(f"{where}: field '{key}' must be {want}, got {type(v).__name__}")
    return v


def _qa(rec: dict, where: str) -> tuple[Any, list[str], list[Any]]:
    tid = _need(rec, "id", (int, str), where)
    questions = _need(rec, "questions", list, where)
    answers = _need(rec, "answers", list, where)
    if len(questions) != len(answers):
        raise RecordError(f"{where}: {len(questions)} questions but {len(answers)} answers")
    if not questions or not all(isinstance(q, str) and q.strip() for q in questions):
        raise RecordError(f"{where}: field 'questions' must be a non-empty list of strings")
    return tid, questions, answers


def _plan(v: Any, where: str, field: str) -> list[dict]:
    if (
        not isinstance(v, list)
        or not v
        or not all(isinstance(d, dict) and day_index(d) is not None for d in v)
    ):
        raise RecordError(f"{where}: field '{field}' must be a non-empty list of day plans with 'days'")
    return v


def render_plan(plan: list[dict]) -> str:
    """A day plan as the writer sees it: one JSON object per day, the published keys in order."""
    return "\n".join(
        json.dumps({k: d[k] for k in (*DAY_KEYS, "day") if k in d}, ensure_ascii=False) for d in plan
    )


def _travel(rec: dict, where: str, source: str, out: LoadResult) -> None:
    tid, questions, answers = _qa(rec, where)
    base = _need(rec, "base_person", dict, where)
    name = _need(base, "name", str, f"{where} base_person")
    base_query = _need(base, "query", str, f"{where} base_person")
    base_plan = _plan(base.get("daily_plans"), where, "base_person.daily_plans")
    plans = [_plan(a, where, f"answers[{k}]") for k, a in enumerate(answers)]
    background = Session(
        session_id="base_person",
        date="",
        turns=[
            Turn(turn_id="base:0", speaker=name, text=base_query),
            Turn(
                turn_id="base:1",
                speaker="assistant",
                text=f"Final plan for {name}:\n{render_plan(base_plan)}",
            ),
        ],
    )
    for k, question in enumerate(questions):
        seq_id = f"{source}/{tid}/s{k:02d}"
        sessions = [background] + [
            _subtask(j, questions[j], f"Final plan:\n{render_plan(plans[j])}") for j in range(k)
        ]
        out.sequences.append(Sequence(sequence_id=seq_id, source=source, sessions=sessions))
        gold = {
            "daily_plans": plans[k],
            "constraint_slots": [list(s) for s in constraint_slots(base_plan, plans[k])],
        }
        out.eval_items.append(
            EvalItem(
                item_id=f"{seq_id}/q{k:03d}",
                benchmark=source,
                sequence_id=seq_id,
                question=question,
                answer=json.dumps(gold, ensure_ascii=False),
                category="group_travel_planner",
                evidence_turn_ids=[],
                # the base plan and every earlier member's plan may be referenced by this member
                evidence_session_ids=[s.session_id for s in sessions],
            )
        )


def _subtask(j: int, question: str, result: str) -> Session:
    """Subtask j as a session of the bank's history: its prompt, then its gold result."""
    turns = [
        Turn(turn_id=f"s{j}:0", speaker="user", text=question),
        Turn(turn_id=f"s{j}:1", speaker="assistant", text=result),
    ]
    return Session(session_id=f"subtask_{j}", date="", turns=turns)


def _shopping(rec: dict, where: str, source: str, out: LoadResult) -> None:
    tid, questions, answers = _qa(rec, where)
    category = _need(rec, "category", str, where)
    targets = []
    for k, a in enumerate(answers):
        w = f"{where} answers[{k}]"
        if not isinstance(a, dict):
            raise RecordError(f"{w}: must be an object {{target_asin, attributes}}")
        asin = _need(a, "target_asin", str, w).strip().upper()
        attrs = a.get("attributes", [])
        if not isinstance(attrs, list) or not all(isinstance(x, str) for x in attrs):
            raise RecordError(f"{w}: field 'attributes' must be a list of strings")
        targets.append((asin, attrs))
    # "baking_item_0" -> "baking": the product domain is the only type label the record carries
    label = category.rsplit("_item_", 1)[0]
    # every question repeats the global rules before "Product <k>:"; the official runner keeps that prefix
    # as the task context, here it is the background session (so subtask 0's sequence is not empty)
    m = re.search(r"Product\s+1:", questions[0], re.IGNORECASE)
    rules = questions[0][: m.start()].strip() if m else ""
    background = Session("task", "", [Turn(turn_id="task:0", speaker="user", text=rules)]) if rules else None
    for k, question in enumerate(questions):
        seq_id = f"{source}/{tid}/s{k:02d}"
        sessions = ([background] if background else []) + [
            _subtask(
                j,
                questions[j],
                f"Purchased product {j + 1}: ASIN {targets[j][0]} ({', '.join(targets[j][1])})",
            )
            for j in range(k)
        ]
        if not sessions:
            raise RecordError(
                f"{where}: questions[0] has no rules before 'Product 1:'; subtask 0 has no context"
            )
        out.sequences.append(Sequence(sequence_id=seq_id, source=source, sessions=sessions))
        out.eval_items.append(
            EvalItem(
                item_id=f"{seq_id}/q{k:03d}",
                benchmark=source,
                sequence_id=seq_id,
                question=question,
                answer=targets[k][0],
                category=label,
                evidence_turn_ids=[],
                evidence_session_ids=[s.session_id for s in sessions],
            )
        )
