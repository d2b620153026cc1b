"""The step profile (hymem_train/callbacks/step_profile.py) on a hand-written metrics.jsonl, and the
metrics it reads that the stages log for it: the wall clock of a step (StepTimer), the rollout
phase's own gateway counters (GatewayCounterDeltas) and reward token counts summed over groups."""

import json
from types import SimpleNamespace

import pytest

from hymem_train.callbacks.gateway_counters import GatewayCounterDeltas
from hymem_train.callbacks.step_profile import (
    OTHER,
    PROFILE_FILE,
    StepProfileReport,
    breakdown,
    format_profile,
    mean_row,
    read_metrics,
)
from hymem_train.logger import StepTimer
from reward.harness_rewards import reduce_group_metrics
from scripts.cost_model import decode_step_s, fwd_flops_per_token

# step 0: the start-up evaluation (4 batches of 2.5 requests). Step 1: logged before the rollout phase
# had its own counters, and evaluated: occupancy is derived from the cumulative mean, gateway counts
# include the evaluation. Step 2: today's metrics, with the wall clock.
ROWS = [
    {
        "step": 0,
        "eval/s": 0.3,
        "gateway/requests_ok": 10.0,
        "gateway/prompt_tokens": 1000.0,
        "gateway/completion_tokens": 100.0,
        "gateway/mean_batch_size": 2.5,
    },
    {
        "step": 1,
        "perf/time_rollout_s": 6.0,
        "perf/time_reward_s": 3.0,
        "perf/time_train_s": 0.5,
        "perf/time_sync_s": 0.5,
        "perf/time_eval_s": 10.0,
        "perf/time_step_s": 20.0,
        "gateway/requests_ok": 20.0,
        "gateway/prompt_tokens": 2000.0,
        "gateway/completion_tokens": 300.0,
        "gateway/mean_batch_size": 3.0,
        "reward/reader_calls": 40.0,
        "reward/judge_calls": 38.0,
        "train/num_loss_tokens": 300.0,
        "perf/tokens_per_s": 1000.0,
        "perf/step_seconds": 0.46,
        "perf/weight_sync_mib": 3.0,
        "perf/weight_sync_seconds": 0.4,
    },
    {
        "step": 2,
        "perf/time_rollout_s": 4.0,
        "perf/time_reward_s": 2.0,
        "perf/time_train_s": 1.0,
        "perf/time_sync_s": 1.0,
        "perf/time_checkpoint_s": 0.5,
        "perf/time_step_s": 8.5,
        "perf/time_wall_s": 10.0,
        "gateway/requests_ok": 16.0,
        "gateway/prompt_tokens": 1600.0,
        "gateway/completion_tokens": 160.0,
        "gateway/mean_batch_size": 3.2,
        "rollout/llm_calls": 16.0,
        "rollout/prompt_tokens": 1600.0,
        "rollout/completion_tokens": 160.0,
        "rollout/engine_batches": 4.0,
        "rollout/mean_batch_size": 4.0,
        "reward/reader_calls": 20.0,
        "reward/judge_calls": 20.0,
        "reward/reader_prompt_tokens": 900.0,
        "reward/reader_completion_tokens": 100.0,
        "reward/judge_prompt_tokens": 500.0,
        "reward/judge_completion_tokens": 50.0,
        "train/num_loss_tokens": 160.0,
        "perf/tokens_per_s": 2000.0,
        "perf/step_seconds": 0.88,
        "perf/weight_sync_mib": 3.0,
        "perf/weight_sync_seconds": 0.9,
    },
]


@pytest.fixture
def run(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path


def test_breakdown_seconds_shares_and_other(run):
    s1, s2 = breakdown(read_metrics(run / "metrics.jsonl"))
    assert (s1.step, s2.step) == ("1", "2")
    # no wall clock in step 1: the step is its timed phases; step 2's untimed 1.5 s is `other`
    assert OTHER not in s1.seconds and s1.total_s == pytest.approx(20.0)
    assert s2.seconds[OTHER] == pytest.approx(1.5) and s2.total_s == pytest.approx(10.0)
    for s in (s1, s2):
        assert sum(s.share(p) for p in s.seconds) == pytest.approx(1.0)
    assert s1.share("eval") == pytest.approx(0.5) and s2.share("rollout") == pytest.approx(0.4)
    assert s2.share("checkpoint") == pytest.approx(0.05) and s1.share("checkpoint") == 0.0


def test_breakdown_amounts_moved(run):
    s1, s2 = breakdown(read_metrics(run / "metrics.jsonl"))
    # step 1: the step's gateway deltas (they include the evaluation: note e); occupancy derived from
    # the cumulative mean: 4 batches after step 0, 30 / 3.0 = 10 after step 1, so 20 requests / 6
    assert s1.moved["llm_calls"] == 20 and s1.moved["prompt_tokens"] == 2000
    assert s1.moved["batch_occupancy"] == pytest.approx(20 / 6) and s1.notes == {"d", "e"}
    assert s1.moved["reader_calls"] == 40 and s1.moved["judge_calls"] == 38
    assert "reader_tokens" not in s1.moved  # not logged then
    assert s1.moved["train_tokens"] == pytest.approx(460.0) and s1.moved["loss_tokens"] == 300
    assert s1.moved["sync_mib"] == 3.0 and s1.moved["sync_s"] == 0.4
    # step 2: the rollout phase's own counters win over the step's gateway deltas
    assert s2.moved["llm_calls"] == 16 and s2.moved["completion_tokens"] == 160
    assert s2.moved["batch_occupancy"] == 4.0 and s2.notes == set()
    assert s2.moved["reader_tokens"] == 1000 and s2.moved["judge_tokens"] == 550
    assert s2.moved["train_tokens"] == pytest.approx(1760.0) and "teacher_tokens" not in s2.moved


def test_mean_rows_and_table(run):
    steps = breakdown(read_metrics(run / "metrics.jsonl"))
    m = mean_row(steps, "mean")
    # a phase a step did not run counts 0 s; the mean row's shares are those of the mean step
    assert m.seconds["rollout"] == pytest.approx(5.0) and m.seconds[OTHER] == pytest.approx(0.75)
    assert m.seconds["eval"] == pytest.approx(5.0) and m.total_s == pytest.approx(15.0)
    assert sum(m.share(p) for p in m.seconds) == pytest.approx(1.0)
    assert m.moved["llm_calls"] == pytest.approx(18.0) and m.moved["reader_tokens"] == 1000
    text = format_profile(steps)
    lines = text.splitlines()
    assert any(ln.startswith("| 2 | 10.00 | 4.00 (40%) |") for ln in lines), text
    assert any(ln.startswith("| mean | 15.00 |") for ln in lines), text
    # the evaluated step 1 is left out of the second mean row: it is step 2 alone
    assert any(ln.startswith("| mean w/o eval | 10.00 | 4.00 (40%) |") for ln in lines), text
    assert "e: gateway counts" in text and "d: engine batch occupancy" in text


def test_opd_teacher_scores_every_sampled_token_and_resume_resets_the_derivation():
    rows = [
        {
            "step": 1,
            "perf/time_rollout_s": 1.0,
            "perf/time_teacher_s": 1.0,
            "gateway/requests_ok": 8.0,
            "gateway/prompt_tokens": 800.0,
            "gateway/completion_tokens": 80.0,
            "gateway/mean_batch_size": 2.0,
        },
        # a resumed run restarts the gateway (and its counters) and logs step 1 again
        {
            "step": 1,
            "perf/time_rollout_s": 1.0,
            "perf/time_teacher_s": 1.0,
            "gateway/requests_ok": 8.0,
            "gateway/prompt_tokens": 800.0,
            "gateway/completion_tokens": 80.0,
            "gateway/mean_batch_size": 4.0,
        },
    ]
    a, b = breakdown(rows)
    assert a.moved["teacher_tokens"] == 880 and a.share("teacher") == pytest.approx(0.5)
    assert a.moved["batch_occupancy"] == pytest.approx(2.0)
    assert b.moved["batch_occupancy"] == pytest.approx(4.0)


def test_report_callback_writes_the_profile(run):
    StepProfileReport(run).on_train_end()
    assert "| mean |" in (run / PROFILE_FILE).read_text()


def test_step_timer_wall_clock(monkeypatch):
    clock = iter([0.0, 1.0, 3.0, 5.0, 6.0, 10.0])
    monkeypatch.setattr("hymem_train.logger.time.perf_counter", lambda: next(clock))
    timer = StepTimer()
    timer.mark()  # t=0
    with timer("rollout"):  # 1 -> 3
        pass
    m = timer.pop()  # t=5: 5 s of wall, 2 of them timed
    assert m == {"perf/time_rollout_s": 2.0, "perf/time_step_s": 2.0, "perf/time_wall_s": 5.0}
    assert timer.pop()["perf/time_wall_s"] == 1.0  # t=6: the clock restarted at the last pop
    assert "perf/time_wall_s" not in StepTimer().pop()  # never marked: no wall clock


def test_step_timer_last_span_is_the_phase_this_step(monkeypatch):
    """`last` is what RL measures the overlap against: the latest span of the phase, reset by `pop`."""
    clock = iter([1.0, 2.0, 4.0, 7.0, 8.0])
    monkeypatch.setattr("hymem_train.logger.time.perf_counter", lambda: next(clock))
    timer = StepTimer()
    with timer("train"):  # 1 -> 2
        pass
    with timer("train"):  # 4 -> 7: the later of two spans
        pass
    assert timer.last("train") == (4.0, 7.0) and timer.last("sync") == (0.0, 0.0)
    assert timer.pop()["perf/time_train_s"] == 4.0  # t=8
    assert timer.last("train") == (0.0, 0.0)  # a step that does not train hides nothing


class FakeGateway:
    """Cumulative gateway counters, advanced by hand."""

    def __init__(self):
        self.c = {
            "gateway/requests_ok": 0.0,
            "gateway/prompt_tokens": 0.0,
            "gateway/completion_tokens": 0.0,
            "gateway/engine_batches": 0.0,
            "gateway/batched_requests": 0.0,
        }

    def calls(self, n, prompt, completion, batches):
        for k, v in zip(self.c, (n, prompt, completion, batches, n), strict=True):
            self.c[k] += v

    def metrics(self):
        m = dict(self.c)
        m["gateway/mean_batch_size"] = m["gateway/batched_requests"] / max(m["gateway/engine_batches"], 1)
        return m


def test_gateway_deltas_keep_the_rollout_phase_apart_from_the_evaluation():
    gw = FakeGateway()
    cb = GatewayCounterDeltas(gw)
    gw.calls(10, 1000, 100, 5)  # step 0's evaluation
    cb.on_step_end(0, m0 := {})
    assert "rollout/llm_calls" not in m0
    gw.calls(7, 700, 70, 7)  # the swap matrix of step 0, run in on_step_end after the counters
    cb.on_rollouts_start(1)
    gw.calls(16, 1600, 160, 4)  # step 1's rollouts
    cb.on_rollouts(1, [])
    gw.calls(30, 3000, 300, 10)  # step 1's evaluation, after the rollouts
    cb.on_step_end(1, m1 := {})
    assert m1["rollout/llm_calls"] == 16 and m1["rollout/prompt_tokens"] == 1600
    assert m1["rollout/completion_tokens"] == 160 and m1["rollout/engine_batches"] == 4
    assert m1["rollout/mean_batch_size"] == 4.0
    assert m1["gateway/requests_ok"] == 53 and m1["gateway/engine_batches"] == 21  # the step's deltas
    assert m1["gateway/mean_batch_size"] == pytest.approx(63 / 26)  # cumulative, as before
    cb.on_step_end(2, m2 := {})  # a step with no rollouts (train_only) logs no rollout share
    assert "rollout/llm_calls" not in m2
    # rl.overlap_rollout: step 4's rollouts finish (another thread) before step 3's metrics are logged
    cb.on_rollouts_start(3), gw.calls(8, 800, 80, 2), cb.on_rollouts(3, [])
    cb.on_rollouts_start(4), gw.calls(12, 1200, 120, 3), cb.on_rollouts(4, [])
    cb.on_step_end(3, m3 := {})
    cb.on_step_end(4, m4 := {})
    assert (m3["rollout/llm_calls"], m4["rollout/llm_calls"]) == (8, 12)


def test_the_mean_in_flight_count_is_logged_as_it_stands_not_differenced():
    class Continuous(FakeGateway):  # the gateway in front of vLLM's async engine
        def metrics(self):
            return {**super().metrics(), "gateway/mean_in_flight": 2.5}

    gw = Continuous()
    cb = GatewayCounterDeltas(gw)
    gw.calls(4, 400, 40, 0)
    cb.on_step_end(1, m1 := {})
    gw.calls(4, 400, 40, 0)
    cb.on_step_end(2, m2 := {})
    assert m1["gateway/mean_in_flight"] == m2["gateway/mean_in_flight"] == 2.5  # a delta would give 0.0


def test_reward_token_counters_are_summed_over_groups():
    groups = [
        SimpleNamespace(
            metrics={"reward/reader_prompt_tokens": 100.0, "reward/reader_calls": 2.0, "reward/s": 0.2}
        ),
        SimpleNamespace(
            metrics={"reward/reader_prompt_tokens": 50.0, "reward/reader_calls": 1.0, "reward/s": 0.4}
        ),
    ]
    m = reduce_group_metrics(groups)
    assert m["reward/reader_prompt_tokens"] == 150 and m["reward/reader_calls"] == 3
    assert m["reward/s"] == pytest.approx(0.3)  # a score stays a per-group mean


def test_cost_model_arithmetic_by_hand():
    # scripts/cost_model.py (the docs/performance.md projection) on a 2-layer toy: numbers by hand

    m = dict(flop_params=1e9, L=2, qdim=100, total=11e9, embed=1e9, experts=8e9, E=8, k=2, kv_bytes=1000)
    # 2 x 1e9 + 4 x 2 layers x 100 x 50 context
    assert fwd_flops_per_token(m, 50) == 2e9 + 40_000
    gpu = {"bw": 1e12}
    # batch 2 touches 1 - (6/8)^2 = 7/16 of the experts: (2e9 + 8e9 x 7/16) x 2 B / TP 2 + 2 x 10 x 1000 B / 2
    step = decode_step_s(m, gpu, 2, 10, 2)
    assert step == pytest.approx((5.5e9 + 10_000) / (1e12 * 0.6))
    assert decode_step_s(m, gpu, 2, 10, 2, kv_scale=0.5) == pytest.approx((5.5e9 + 5_000) / 0.6e12)
