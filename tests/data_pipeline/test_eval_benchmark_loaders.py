"""PersonaMem-v2 and MemoryArena loaders on hand-written fixtures in the published layouts
(tests/fixtures/eval_benchmarks/, docs/evaluation_benchmarks.md)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from data_pipeline.build import DataConfig, SourceConfig, load_sources
from data_pipeline.memoryarena import constraint_slots, load_memoryarena, similarity
from data_pipeline.personamem import load_personamem_v2, mcq_options
from data_pipeline.schema import RecordError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "eval_benchmarks"
PM_ROOT = FIX / "personamem_v2"
PM_CSV = PM_ROOT / "benchmark" / "text" / "benchmark.csv"
MA = FIX / "memoryarena"


def _copy_pm(tmp_path: Path) -> Path:
    dst = tmp_path / "pm"
    shutil.copytree(PM_ROOT, dst)
    return dst / "benchmark" / "text" / "benchmark.csv"


def _rewrite_csv(path: Path, edit) -> None:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        cols, rows = list(reader.fieldnames or []), list(reader)
    cols, rows = edit(cols, rows)
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


# ----------------------------------------------------------------------------------------- PersonaMem


def test_personamem_one_sequence_per_persona_and_one_item_per_row():
    res = load_personamem_v2(PM_CSV)
    assert [s.sequence_id for s in res.sequences] == ["personamem_v2/0", "personamem_v2/1"]
    assert [it.item_id for it in res.eval_items] == [
        "personamem_v2/0/q000",
        "personamem_v2/0/q001",
        "personamem_v2/1/q002",
    ]
    assert [it.category for it in res.eval_items] == [
        "health_and_medical_conditions",
        "stereotypical_pref",
        "anti_stereotypical_pref",
    ]
    assert all(it.benchmark == "personamem_v2" and it.question_date == "" for it in res.eval_items)
    assert res.issues == []


def test_personamem_history_drops_persona_system_prompt_and_keeps_text_parts():
    seq0, seq1 = load_personamem_v2(PM_CSV).sequences
    assert len(seq0.sessions) == 1 and seq0.sessions[0].date == ""
    texts = [t.text for t in seq0.turns()]
    assert not any("Current user persona" in t for t in texts)  # the profile would leak the answers
    assert seq0.turns()[0].turn_id == "m1"  # ids keep the position in the published chat_history list
    assert seq1.turns()[0].text == "Fix the grammar in my lesson plan intro."  # multimodal parts -> text


def test_personamem_mcq_renders_options_and_answer_is_the_correct_option():
    item = load_personamem_v2(PM_CSV).eval_items[0]
    letter, text = item.answer.split(". ", 1)
    assert text.startswith("An indoor botanical-free museum day")
    assert f"\n{letter}. {text}\n" in item.question
    assert item.question.startswith("Any ideas for a relaxing spring weekend outdoors?")
    assert "Final Answer: [Letter]" in item.question
    assert sum(f"\n{c}. " in item.question for c in "ABCD") == 4


def test_personamem_option_order_is_stable():
    a = mcq_options("0", "q", "right", ["w1", "w2", "w3"])
    assert a == mcq_options("0", "q", "right", ["w1", "w2", "w3"])
    assert sorted(a[1]) == ["right", "w1", "w2", "w3"]
    assert (
        load_personamem_v2(PM_CSV).eval_items[0].question == load_personamem_v2(PM_CSV).eval_items[0].question
    )


def test_personamem_evidence_from_related_snippet():
    items = load_personamem_v2(PM_CSV).eval_items
    assert [it.evidence_turn_ids for it in items] == [["m1", "m2"], ["m5", "m6"], ["m3", "m4"]]


def test_personamem_missing_column_names_file(tmp_path):
    csv_path = _copy_pm(tmp_path)
    _rewrite_csv(
        csv_path,
        lambda cols, rows: (
            [c for c in cols if c != "incorrect_answers"],
            [{k: v for k, v in r.items() if k != "incorrect_answers"} for r in rows],
        ),
    )
    with pytest.raises(RecordError, match=r"benchmark\.csv: not a PersonaMem-v2 CSV.*incorrect_answers"):
        load_personamem_v2(csv_path)


def test_personamem_bad_user_query_names_row(tmp_path):
    csv_path = _copy_pm(tmp_path)

    def edit(cols, rows):
        rows[1]["user_query"] = "{'role': 'user'"
        return cols, rows

    _rewrite_csv(csv_path, edit)
    with pytest.raises(RecordError, match=r"row 1 \(persona '0'\): field 'user_query'"):
        load_personamem_v2(csv_path)


def test_personamem_missing_history_file(tmp_path):
    csv_path = _copy_pm(tmp_path)
    (tmp_path / "pm" / "data" / "chat_history_32k" / "chat_history_250831_232015_persona1.json").unlink()
    with pytest.raises(
        RecordError, match=r"row 2 .*chat history 'data/chat_history_32k/.*persona1\.json' not found"
    ):
        load_personamem_v2(csv_path)


def test_personamem_history_root_and_size(tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.copytree(PM_ROOT / "data", moved / "data")
    csv_path = tmp_path / "benchmark.csv"
    shutil.copy(PM_CSV, csv_path)
    assert len(load_personamem_v2(csv_path, history_root=moved).sequences) == 2
    with pytest.raises(ValueError, match="size '64k'"):
        load_personamem_v2(PM_CSV, size="64k")


# ----------------------------------------------------------------------------------------- MemoryArena


def test_travel_one_prefix_sequence_per_subtask_without_its_answer():
    res = load_memoryarena(MA, "group_travel_planner")
    assert [it.item_id for it in res.eval_items] == [
        "memoryarena_travel/0/s00/q000",
        "memoryarena_travel/0/s01/q001",
        "memoryarena_travel/1/s00/q000",
    ]
    seqs = {s.sequence_id: s for s in res.sequences}
    first, second = seqs["memoryarena_travel/0/s00"], seqs["memoryarena_travel/0/s01"]
    assert [s.session_id for s in first.sessions] == ["base_person"]
    assert [s.session_id for s in second.sessions] == ["base_person", "subtask_0"]
    # member 1's plan (Gupta's Rasoi dinner on day 2) is in the bank for member 2, never for member 1
    assert not any("Gupta" in t.text for t in first.turns())
    assert any("Gupta" in t.text for t in second.turns())
    assert first.turns()[0].speaker == "Jennifer"


def test_travel_answer_holds_gold_plan_and_constraint_slots():
    items = load_memoryarena(MA, "group_travel_planner").eval_items
    gold = [json.loads(it.answer) for it in items]
    assert gold[0]["constraint_slots"] == [[2, "dinner"]]
    assert gold[1]["constraint_slots"] == [[1, "dinner"], [2, "breakfast"]]
    assert gold[2]["constraint_slots"] == []  # same plan as the base person: nothing to score
    assert gold[1]["daily_plans"][1]["breakfast"] == "Flying Mango, Rockford"
    assert all(it.benchmark == "memoryarena_travel" and it.category == "group_travel_planner" for it in items)


def test_official_similarity_rules():
    assert similarity("-", "-") == 1.0
    assert similarity("", "x") == 0.0
    assert similarity("Coco Bambu, Rockford", "coco bambu, rockford") == 1.0
    base = [{"days": 1, "dinner": "A"}]
    assert constraint_slots(base, [{"days": 1, "dinner": "Zzz"}]) == [(1, "dinner")]


def test_shopping_prefix_sequences_and_asin_answers():
    res = load_memoryarena(MA / "bundled_shopping" / "test.jsonl", "bundled_shopping")
    assert [it.answer for it in res.eval_items] == [
        "B00TUDFEW2",
        "B08957C9ZH",
        "B00EJRV4V4",
        "B00T6NA7PA",
        "B08R438XGV",
    ]
    seqs = {s.sequence_id: s for s in res.sequences}
    third = seqs["memoryarena_shopping/0/s02"]
    assert [s.session_id for s in third.sessions] == ["task", "subtask_0", "subtask_1"]
    bank = " ".join(t.text for t in third.turns())
    assert "B00TUDFEW2" in bank and "B08957C9ZH" in bank and "B00EJRV4V4" not in bank
    assert "Product 1:" not in third.sessions[0].turns[0].text  # the shared rules only
    assert {it.category for it in res.eval_items} == {"baking"}


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (
            '{"id": 3, "questions": ["a"], "answers": []}',
            r"test\.jsonl:1 \(task id 3\): 1 questions but 0 answers",
        ),
        (
            '{"id": 3, "questions": ["a"], "answers": [[{"days": 1}]]}',
            r"task id 3\): missing field 'base_person'",
        ),
        ('{"id": 3, "questions": ["a"', r"test\.jsonl:1: not valid JSON"),
    ],
)
def test_travel_malformed_records(tmp_path, line, match):
    f = tmp_path / "test.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(RecordError, match=match):
        load_memoryarena(f, "group_travel_planner")


def test_shopping_bad_answer_and_unknown_task(tmp_path):
    f = tmp_path / "test.jsonl"
    f.write_text(
        json.dumps({"id": 9, "questions": ["r\nProduct 1: x"], "answers": ["B00X"], "category": "c_item_0"})
    )
    with pytest.raises(RecordError, match=r"task id 9\) answers\[0\]: must be an object"):
        load_memoryarena(f, "bundled_shopping")
    with pytest.raises(ValueError, match="progressive_search"):
        load_memoryarena(f, "progressive_search")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordError, match="holds no"):
        load_memoryarena(tmp_path / "empty", "bundled_shopping")


# ----------------------------------------------------------------------------------------- build kinds


def test_build_dispatches_the_new_source_kinds():
    cfg = DataConfig(
        name="t",
        sources=[
            SourceConfig(kind="personamem_v2", path=str(PM_CSV)),
            SourceConfig(kind="memoryarena_travel", path=str(MA)),
            SourceConfig(kind="memoryarena_shopping", path=str(MA), name="shop"),
        ],
        profiles={},
    )
    loaded, synth = load_sources(cfg)
    assert synth is None
    assert {it.benchmark for it in loaded.eval_items} == {"personamem_v2", "memoryarena_travel", "shop"}
