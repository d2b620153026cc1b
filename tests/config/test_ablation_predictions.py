"""The ablation table's registered directions: the runner's `PREDICTED` is the table of
docs/ablation_predictions.md (written before the runs), and a direction is judged on its own metric
with the interval's sign, paired by seed."""

import json
import math
import re
import threading
from pathlib import Path

import pytest

from scripts.demo_lib.ablations import (
    BASELINE,
    MANIFEST,
    PREDICTED,
    Ablation,
    mean_ci,
    plan_array,
    reusable,
    run_by_seed,
    seeds_of,
    t_crit,
    verdicts,
    write_table,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "ablation_predictions.md"
# how the registered page names each metric of reward/bank_metrics.py
DOC_METRIC = {
    "false_memory_resistance": "false-memory resistance",
    "bank_records": "records per bank",
    "memory_recall": "memory recall",
    "history_kept": "history kept",
}


def _doc_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `(\w+)`[^|]*\|[^|]*\|([^|]*)\|([^|]*)\|", line)
        if m:
            rows[m.group(1)] = (m.group(2).strip(), m.group(3).strip())
    return rows


def test_predicted_is_the_registered_table():
    rows = _doc_rows()
    assert set(PREDICTED) == {n for n, (_, sign) in rows.items() if sign != "not run"}
    for name, p in PREDICTED.items():
        metric, sign = rows[name]
        if p.identical:
            assert metric == "every metric" and "identical by construction" in sign, name
            continue
        assert metric.startswith(DOC_METRIC[p.metric]), (name, metric)
        if sign.startswith("baseline - control > 0"):  # format_only states it from the other side
            want = "-"
        else:
            want = {"<": "-", ">": "+", "0": "0"}[sign[0]]
        assert p.sign == want, (name, sign)


def _arm(name: str, values: list[dict[str, float]], paired: bool = True) -> Ablation:
    return Ablation(name, "k", [], metrics=dict(enumerate(values)), paired=paired)


def _m(fmr: float, recall: float = 0.1) -> dict[str, float]:
    return {
        "false_memory_resistance": fmr,
        "memory_recall": recall,
        "bank_records": 5.0,
        "op_invalid": 0.1,
        "unparsed_share": 0.0,
        "history_kept": 0.0,
    }


def test_verdicts_pair_by_seed_and_judge_the_registered_sign(tmp_path):
    # a consistent -0.1 on false-memory resistance under seed-to-seed spread of 0.3: paired it separates
    base = _arm(BASELINE, [_m(0.5), _m(0.8), _m(0.2)])
    no_traps = _arm("no_traps", [_m(0.4), _m(0.71), _m(0.09)])
    unpaired = _arm("window_level_grpo", [_m(0.4), _m(0.71), _m(0.09)], paired=False)
    same = _arm("binary_reward", [_m(0.5), _m(0.8), _m(0.2)])
    off = _arm("one_vote_loss", [_m(0.5), _m(0.8), _m(0.2, recall=0.11)])
    v = {x.name: x for x in verdicts([base, no_traps, unpaired, same, off])}
    assert v["no_traps"].diff == pytest.approx(-0.1)
    assert v["no_traps"].observed == "-" and v["no_traps"].held == "yes"
    # the same numbers unpaired (Welch) cannot separate: the spread between seeds swamps them
    assert v["window_level_grpo"].observed == "0" and v["window_level_grpo"].held == "no"
    assert v["binary_reward"].observed == "identical" and v["binary_reward"].held == "yes"
    # identical by construction fails on any metric that differs, not only its own
    assert v["one_vote_loss"].held == "no"
    text = write_table([base, no_traps, same], tmp_path / "t.md", steps=24, seeds=3, wall_s=60.0)
    row = next(r for r in text.splitlines() if r.startswith("| no_traps | false_memory_resistance"))
    assert "| 3 | - | - | yes |" in row
    # one seed: no interval, so no verdict either way; an identical-by-construction arm is still judged
    one = verdicts([_arm(BASELINE, [_m(0.5)]), _arm("no_traps", [_m(0.2)]), _arm("binary_reward", [_m(0.5)])])
    assert math.isnan(one[0].half) and one[0].held == "n/a"
    assert one[1].seeds == 1 and one[1].held == "yes"
    one = verdicts([_arm(BASELINE, [_m(0.5)]), _arm("binary_reward", [_m(0.5, recall=0.2)])])
    assert one[0].held == "no"


def test_identical_arms_run_one_seed_unless_asked(tmp_path):
    """An arm registered identical by construction runs one seed (an exact equality needs no spread);
    every other arm runs them all."""

    def planned(**kw):
        plan_array(tmp_path, base="demo_rl", seeds=3, only=[BASELINE, "binary_reward", "no_traps"], **kw)
        return [tuple(r.split("\t")[:2]) for r in (tmp_path / MANIFEST).read_text().splitlines()]

    assert PREDICTED["binary_reward"].identical and not PREDICTED["no_traps"].identical
    got = planned()
    assert got.count(("binary_reward", "0")) == 1 and len([r for r in got if r[0] == "binary_reward"]) == 1
    assert len([r for r in got if r[0] == "no_traps"]) == 3 and len([r for r in got if r[0] == BASELINE]) == 3
    assert len([r for r in planned(identical_seeds=3) if r[0] == "binary_reward"]) == 3


def test_a_design_on_fresh_seeds_starts_past_the_seeds_already_run(tmp_path):
    """--first-seed K runs run.seed K..K+N-1 and none below K: a design read once on fresh seeds must not
    fold in the seeds that motivated it."""
    plan_array(tmp_path, base="demo_rl", seeds=3, only=[BASELINE, "binary_reward", "no_traps"], first_seed=10)
    rows = [r.split("\t") for r in (tmp_path / MANIFEST).read_text().splitlines()]
    assert sorted(int(r[1]) for r in rows if r[0] == "no_traps") == [10, 11, 12]
    assert [int(r[1]) for r in rows if r[0] == "binary_reward"] == [10]
    assert all(f"run.seed={r[1]}" in r and r[2].endswith(f"seed{r[1]}") for r in rows)
    with pytest.raises(ValueError, match="first_seed=-1"):
        seeds_of("no_traps", 3, 1, first_seed=-1)


def test_a_metric_with_nothing_to_count_drops_that_seed_not_the_table(tmp_path):
    # history_kept is None where a seed's data holds no Transition: that seed is no evidence, the
    # others still decide, and the context table prints what it has
    none = {**_m(0.5), "history_kept": None}
    base = _arm(BASELINE, [none, {**_m(0.5), "history_kept": 0.6}, {**_m(0.5), "history_kept": 0.7}])
    cf = _arm(
        "counterfactual_orm", [none, {**_m(0.5), "history_kept": 0.6}, {**_m(0.5), "history_kept": 0.7}]
    )
    (v,) = verdicts([base, cf])
    assert v.seeds == 2 and v.diff == 0.0 and v.base == pytest.approx(0.65)
    text = write_table([base, cf], tmp_path / "t.md", steps=24, seeds=3, wall_s=60.0)
    assert "| counterfactual_orm | `k` | 3 |" in text


def test_a_seeds_evaluation_starts_beside_the_next_seeds_runs():
    # seed 1's runs finish only once seed 0's evaluation has started: waiting for every run first
    # (the table's old order) would time out here
    evaluated = threading.Event()
    order = []

    def run(seed):
        def job():
            if seed == 1:
                assert evaluated.wait(timeout=10), "seed 0's evaluation did not start beside seed 1's runs"
            order.append(f"run{seed}")

        return job

    def after(seed):
        order.append(f"eval{seed}")
        evaluated.set()

    run_by_seed({1: [run(1), run(1)], 0: [run(0), run(0)]}, jobs=2, after_seed=after)
    assert order[:3] == ["run0", "run0", "eval0"] and sorted(order[3:]) == ["eval1", "run1", "run1"]
    assert order[-1] == "eval1"


def test_a_failed_run_drops_the_runs_not_started():
    ran = []

    def boom():
        raise RuntimeError("exit 3")

    with pytest.raises(RuntimeError, match="exit 3"):
        run_by_seed({0: [boom], 1: [lambda: ran.append(1)]}, jobs=1, after_seed=ran.append)
    assert ran == []  # neither seed 1's run nor seed 0's evaluation


def test_intervals_use_students_t_at_every_seed_count_and_level():
    """Printed-table values of Student's t (two-sided): a normal quantile beyond ten seeds made the
    sixteen-seed interval 8% too narrow."""
    for level, df, want in [
        (0.95, 1, 12.706),
        (0.95, 9, 2.262),
        (0.95, 15, 2.131),
        (0.95, 30, 2.042),
        (0.975, 15, 2.490),
        (0.99, 5, 4.032),
    ]:
        assert t_crit(level, df) == pytest.approx(want, abs=6e-4), (level, df)
    assert t_crit(0.95, 1e7) == pytest.approx(1.960, abs=1e-3)
    xs = [(-1.0) ** i * (1 + i % 3) / 10 for i in range(16)]
    m, h = mean_ci(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / 15)
    assert h == pytest.approx(2.1314 * sd / 4, rel=1e-4)
    assert mean_ci(xs, 0.975)[1] == pytest.approx(2.4899 * sd / 4, rel=1e-4)
    with pytest.raises(ValueError, match="level=1.5"):
        t_crit(1.5, 3)


def test_a_finished_run_is_reused_across_a_comment_edit_not_a_value_edit(tmp_path):
    """The run key compares what the recipe sets, not its text: a comment edited in the recipe keeps
    every finished run; a changed value, command or start reruns it."""
    run = tmp_path / "seed0"
    (run / "final").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 24}\n')
    recipe = "# @package _global_\n# lr: why (docs/a.md)\ntrainer:\n  lr: 1.0e-4  # a note\n"
    key = {"run_version": "v3", "cmd": ["-m", "hymem_train.rl", "run.seed=0"], "recipe": recipe, "from": []}
    (run / "ablation_key.json").write_text(json.dumps(key))
    assert reusable(run, 24, {**key, "recipe": recipe.replace("docs/a.md", "docs/log/a.md")})
    assert not reusable(run, 24, {**key, "recipe": recipe.replace("1.0e-4", "3.0e-4")})
    assert not reusable(run, 24, {**key, "recipe": recipe.replace("# @package _global_\n", "")})
    assert not reusable(run, 24, {**key, "cmd": ["-m", "hymem_train.rl", "run.seed=1"]})
    assert not reusable(run, 25, key)  # not finished at the asked length
