"""Re-apply single mutations to the guards and check that the named tests fail.

    cd <repo root> && python scripts/mutations.py                  # every mutation (~15 min on 2 cores)
    python scripts/mutations.py --fast                             # skip the ones whose tests are slow
    python scripts/mutations.py --only ppo_lower_clip mem0_pagination
    python scripts/mutations.py --list
    python scripts/mutations.py --only mem0_pagination --tests tests/harnesses/test_mem0.py  # other tests

Each mutation replaces one exact snippet of one file by a broken one, runs its named pytest node ids,
and restores the file (try/finally; at the end `git diff --quiet` must hold for every mutated file).
It edits this checkout: a run started from it meanwhile (`make ablations` beside it) imports the mutant.
A mutation is "caught" when every one of its named tests fails; it "survives" when any of them passes.
The first line of each failure is printed, so a test that fails through an incidental crash (an
AttributeError) instead of the guard's own error or number shows. Exit status 1 when any mutation
survives or a named test was skipped (nothing verified). The table stays honest without running the
mutations: tests/test_mutations_table.py checks in CI that every original snippet still occurs exactly
once in its file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repository root
    original: str  # must occur exactly once in the file
    mutated: str
    tests: tuple[str, ...]  # pytest node ids; each must fail on the mutation
    slow: bool = False


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(  # silent failure bank-not-carried: every window starts from an empty bank
        "bank_not_carried_parent_none",
        "hymem_train/rollout/collector.py",
        "parent = self.lineage.parent(lid, sw.epoch, w.index)",
        "parent = None",
        ("tests/rollout/test_collector.py::test_next_window_starts_from_the_promoted_bank",),
    ),
    Mutation(  # silent failure platform-error-as-reward: a platform-failed rollout scored as policy behaviour
        "platform_error_rollout_scored",
        "reward/scoring.py",
        "        if failed:\n            ok_C = [False] * C\n",
        "",
        ("tests/reward/test_reward_scoring.py::test_platform_error_rollout_is_never_scored",),
    ),
    Mutation(  # silent failure platform-error-as-reward: platform-failed rollouts kept for training
        "platform_error_usable_keeps_failed",
        "hymem_train/rollout/collector.py",
        "return [(i, r) for i, r in enumerate(self.results) if r.record.status != PLATFORM_ERROR]",
        "return list(enumerate(self.results))",
        (
            "tests/rollout/test_collector.py::test_platform_failed_rollouts_are_not_trained_on",
            "tests/rollout/test_collector.py::test_usable_excludes_platform_errors",
        ),
    ),
    Mutation(
        "platform_error_advantage_items_use_all",
        "hymem_train/trainer/items.py",
        "        for i, r in g.usable():\n",
        "        for i, r in enumerate(g.results):\n",
        ("tests/rollout/test_collector.py::test_platform_failed_rollouts_are_not_trained_on",),
    ),
    Mutation(
        "platform_error_teacher_items_use_all",
        "hymem_train/trainer/items.py",
        "segs = [s for g in groups for _, r in g.usable() for s in r.segments]",
        "segs = [s for g in groups for r in g.results for s in r.segments]",
        ("tests/rollout/test_collector.py::test_platform_failed_rollouts_are_not_trained_on",),
    ),
    Mutation(  # silent failure platform-error-as-reward: a killed sandbox reported as an OK write (no retry, no restore)
        "platform_error_sandbox_crash_reported_ok",
        "harnesses/sandbox.py",
        'return WriteResult(WriteStatus.PLATFORM_ERROR, 0, f"{e} (after {time.monotonic() - t0:.1f} s)")',
        'return WriteResult(WriteStatus.OK, 0, f"{e} (after {time.monotonic() - t0:.1f} s)")',
        (
            "tests/harnesses/test_sandbox.py::test_killed_sandbox_mid_write_is_platform_error_and_bank_restored",
            "tests/stages/test_fault_injection.py::test_rl_run_classifies_and_counts_injected_faults",
        ),
        slow=True,
    ),
    Mutation(
        "ppo_lower_clip",
        "hymem_train/trainer/losses.py",
        "ratio_N.clamp(1.0 - clip_low, 1.0 + clip_high)",
        "ratio_N.clamp(max=1.0 + clip_high)",
        ("tests/trainer/test_ppo_clip_mutations.py::test_lower_clip_binds_for_negative_advantage",),
    ),
    Mutation(
        "ppo_upper_clip",
        "hymem_train/trainer/losses.py",
        "ratio_N.clamp(1.0 - clip_low, 1.0 + clip_high)",
        "ratio_N.clamp(min=1.0 - clip_low)",
        (
            "tests/trainer/test_losses.py::test_ppo_golden",
            "tests/trainer/test_ppo_clip_mutations.py::test_upper_clip_binds_for_positive_advantage",
        ),
    ),
    Mutation(  # silent failure capped-read-all: read_all stops after the first scroll page
        "mem0_pagination",
        "harnesses/adapters/mem0.py",
        "            if offset is None:\n                break\n",
        "            break\n",
        ("tests/harnesses/test_mem0.py::test_read_all_follows_every_scroll_page",),
        slow=True,
    ),
    Mutation(  # routing replay: the trainer's mismatch rate averaged wrongly (still in [0, 1])
        "replay_mismatch_unweighted",
        "hymem_train/trainer/engine.py",
        '[st["moe/replay_mismatch_rate"] * st["moe/replayed_slots"], st["moe/replayed_slots"]]',
        '[st["moe/replay_mismatch_rate"], st["moe/replayed_slots"]]',
        ("tests/trainer/test_engine_dist.py::test_opd_step_on_one_rank_logs_support_metrics",),
        slow=True,
    ),
    Mutation(  # routing replay: the trainer forwards with free routes
        "replay_not_applied_in_trainer",
        "hymem_train/trainer/engine.py",
        "        return self.routing.replay(mb.routes_1TLE)\n",
        "        return contextlib.nullcontext()\n",
        ("tests/trainer/test_engine_dist.py::test_opd_step_on_one_rank_logs_support_metrics",),
        slow=True,
    ),
    Mutation(  # silent failure teacher-without-topk: no top-k guard in opd_items
        "no_topk_guard_items",
        "hymem_train/trainer/items.py",
        "if tk is None or tk.ids_TK is None or tk.ids_TK.numel() == 0:",
        "if False:",
        ("tests/trainer/test_items.py::test_opd_items_raise_on_missing_or_short_teacher_answer",),
    ),
    Mutation(  # silent failure teacher-without-topk: no top-k guard in packing
        "no_topk_guard_packing",
        "hymem_train/trainer/packing.py",
        "if ids is None or lps is None or np.size(ids) == 0:",
        "if False:",
        ("tests/trainer/test_packing.py::test_opd_without_teacher_topk_raises",),
    ),
    Mutation(  # CI time: DeepSpeed's CPU shared-memory op compiled at every comm init on a new box
        "deepspeed_shm_op_built",
        "hymem_train/trainer/engine.py",
        '        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False\n',
        "",
        ("tests/trainer/test_engine_dist.py::test_cpu_comm_init_skips_deepspeeds_shared_memory_op",),
        slow=True,
    ),
    Mutation(  # silent failure wrong-logits-after-sync: a replica loads every bucket but never finishes the sync
        "replica_sync_never_finished",
        "hymem_train/trainer/weight_group.py",
        "        engine.finish_sync(version)\n",
        "        pass\n",
        ("tests/trainer/test_weight_group.py::test_broadcast_wire_format_roundtrip",),
    ),
    Mutation(  # silent failure resume-skips-windows: a restart with no checkpoint keeps the killed step's cursor
        "restart_keeps_killed_cursor",
        "hymem_train/stage.py",
        "            stage.scheduler.start_over()\n",
        "            pass\n",
        ("tests/stages/test_stages_cli.py::test_rl_kill9_then_resume_reproduces_the_uninterrupted_run",),
    ),
    Mutation(  # silent failure resume-skips-windows: starting over leaves the cursor where it was
        "start_over_keeps_cursor",
        "hymem_train/rollout/scheduler.py",
        '        self.restore({"cursor": dict.fromkeys(self.keys, 0), "epoch": dict.fromkeys(self.keys, 0), "rr": 0})\n',
        "        self.restore(self.state())\n",
        ("tests/rollout/test_rollout_worker.py::test_a_scheduler_starts_over_without_a_checkpoint",),
    ),
    Mutation(  # silent failure request-straddles-sync: a segment stamped with the engine's version after the fact
        "segment_version_from_engine_attribute",
        "hymem_train/gateway/server.py",
        "policy_version=out.policy_version\n            if out.policy_version is not None\n            else self.engine.policy_version,",
        "policy_version=self.engine.policy_version,",
        ("tests/gateway/test_continuous.py::test_a_segment_carries_the_version_its_engine_stamped",),
    ),
    Mutation(  # silent failure bank-not-carried: the reopened bank's known record is not compared
        "lineage_known_record_unchecked",
        "hymem_train/rollout/lineage.py",
        "if n != b.num_entries or (b.known_id and texts.get(b.known_id) != b.known_text):",
        "if n != b.num_entries:",
        ("tests/rollout/test_rollout_worker.py::test_lineage_promotes_reopens_and_detects_a_lost_bank",),
    ),
    Mutation(  # the next window's growth baseline read from the window's first chunk, not its last
        "promoted_size_from_first_chunk",
        "hymem_train/rollout/collector.py",
        "size_tokens=rec.chunks[-1].size_tokens or 0,",
        "size_tokens=rec.chunks[0].size_tokens or 0,",
        ("tests/rollout/test_collector.py::test_next_window_starts_from_the_promoted_bank",),
    ),
    Mutation(  # a rollout with a platform-failed cell competes for promotion
        "best_rollout_admits_invalid",
        "reward/service.py",
        "for i, (s, v) in enumerate(zip(s_GC, valid_GC, strict=True)) if all(v)]",
        "for i, (s, v) in enumerate(zip(s_GC, valid_GC, strict=True))]",
        (
            "tests/reward/test_reward_service.py::test_best_rollout_ties_go_to_the_lowest_index_and_invalid_rollouts_never_compete",
        ),
    ),
    Mutation(  # a tie goes to the highest index
        "best_rollout_tie_to_last",
        "reward/service.py",
        "return -max(cands)[1] if cands else None",
        "return -max(cands, key=lambda c: (c[0], -c[1]))[1] if cands else None",
        (
            "tests/reward/test_reward_service.py::test_best_rollout_ties_go_to_the_lowest_index_and_invalid_rollouts_never_compete",
        ),
    ),
    Mutation(  # a column with fewer than 2 valid rollouts normalised anyway
        "advantage_fewer_than_two_unguarded",
        "reward/advantage.py",
        "        rows = [i for i in range(G) if valid_GC[i][t]]\n        if len(rows) < 2:\n            continue\n",
        "        rows = [i for i in range(G) if valid_GC[i][t]]\n",
        ("tests/reward/test_reward_advantage.py::test_group_with_one_valid_rollout_gets_zero",),
    ),
    # the evaluation (docs/evaluation.md): budgets, failure classes, paired clustered intervals, the means
    Mutation(  # every benchmark read under one 64-token budget again: plans and reasoned answers cut
        "eval_reader_budget_64",
        "hymem_train/evaluation/matrix.py",
        "budget = self.cfg.protocol.budget(m)",
        "budget = 64",
        (
            "tests/evaluation/test_evaluate.py::"
            "test_each_benchmark_reads_under_its_published_budget_and_cut_answers_are_counted",
        ),
        slow=True,
    ),
    Mutation(  # a writer's failures dropped from its mean again (a writer that breaks on hard items gains)
        "eval_writer_failures_dropped",
        "hymem_train/evaluation/report.py",
        "or failure_class(per_writer[w][i]) == PLATFORM\n",
        "or failure_class(per_writer[w][i]) is not None\n",
        (
            "tests/evaluation/test_report.py::"
            "test_writer_failures_score_zero_and_platform_failures_drop_the_item_for_every_writer",
        ),
    ),
    Mutation(  # a writer's timeout excused as the platform's
        "eval_writer_timeout_as_platform",
        "hymem_train/evaluation/matrix.py",
        "exc = WriterFailure if res.writer_timeout else PlatformError",
        "exc = PlatformError",
        (
            "tests/evaluation/test_evaluate.py::"
            "test_a_writer_that_times_out_fails_its_items_as_zeros_and_is_not_retried",
        ),
        slow=True,
    ),
    Mutation(  # writers and cells resampled independently: neither paired nor clustered
        "eval_unpaired_resampling",
        "hymem_train/evaluation/report.py",
        'shared = _stratified_weights(rng, B, C, data) if resampling == "clustered" else None',
        "shared = None",
        (
            "tests/evaluation/test_report.py::test_a_small_paired_difference_is_detected_paired_and_missed_unpaired",
            "tests/evaluation/test_report.py::test_clustered_intervals_widen_where_items_are_shared_across_cells",
        ),
    ),
    Mutation(  # the shared draw taken from the pool of sequences: a replicate can miss a whole benchmark
        "eval_clustered_draw_unstratified",
        "hymem_train/evaluation/report.py",
        'shared = _stratified_weights(rng, B, C, data) if resampling == "clustered" else None',
        'shared = _weights(rng, B, C, np.arange(C)) if resampling == "clustered" else None',
        ("tests/evaluation/test_report.py::test_clustered_draw_keeps_every_benchmark_in_every_replicate",),
    ),
    Mutation(  # the run-time leak check removed: a writer serving a reader call goes unnoticed
        "eval_leak_check_removed",
        "hymem_train/evaluation/matrix.py",
        "        if served and served() != before:\n",
        "        if False:\n",
        ("tests/evaluation/test_evaluate.py::test_writer_that_serves_a_fixed_role_is_refused",),
        slow=True,
    ),
    Mutation(  # Shopping PS averaged into the harness means again
        "eval_shopping_ps_in_means",
        "hymem_train/evaluation/report.py",
        'OUT_OF_MEANS = {"Shopping PS"}',
        "OUT_OF_MEANS: set[str] = set()",
        (
            "tests/evaluation/test_report.py::test_shopping_ps_is_a_column_out_of_every_mean_and_cmb_is_not_run",
        ),
    ),
    Mutation(  # silent failure eval-at-training-temperature, in the standalone evaluation
        "eval_training_decoding",
        "hymem_train/evaluate.py",
        "cfg = with_writer_decoding(cfg)",
        "cfg = cfg",
        ("tests/evaluation/test_evaluate.py::test_the_writer_decodes_as_the_protocol_says",),
    ),
    Mutation(  # a cache built under one writer decoding resumed under another
        "eval_plan_without_decoding",
        "hymem_train/evaluation/matrix.py",
        '"writer_decoding": writer_sampling(cfg.harnesses[p.harness]),',
        '"writer_decoding": {},',
        ("tests/evaluation/test_evaluate.py::test_the_writer_decodes_as_the_protocol_says",),
    ),
    Mutation(  # a writer's cached banks resumed by another writer under the same name
        "eval_cache_any_writer",
        "hymem_train/evaluation/matrix.py",
        "                check_writer(self.out, w)\n",
        "                pass\n",
        (
            "tests/evaluation/test_evaluate.py::"
            "test_writers_added_to_a_run_reuse_its_cache_and_another_writer_under_an_old_name_is_refused",
        ),
    ),
    Mutation(  # a checkpoint retrained in place taken for the one whose banks are cached
        "eval_cache_ignores_checkpoint_files",
        "hymem_train/evaluation/matrix.py",
        'ident["files"] = [[str(f.relative_to(root)), f.stat().st_size, f.stat().st_mtime_ns] for f in files]',
        'ident["files"] = []',
        ("tests/evaluation/test_evaluate.py::test_a_checkpoint_retrained_in_place_is_another_writer",),
    ),
    Mutation(  # an ablation run reused after the demo it starts from was retrained under the same root
        "ablation_reuse_ignores_start",
        "scripts/demo_lib/ablations.py",
        '"recipe": RECIPE.read_text(), "from": starts}',
        '"recipe": RECIPE.read_text()}',
        ("tests/stages/test_ablations.py::test_runner_micro_scale_table_shape",),
        slow=True,
    ),
    Mutation(  # several ranks at ZeRO stage 0 log a rank's own gradient share as the step's norm
        "grad_norm_local_share",
        "hymem_train/trainer/engine.py",
        "        if self.world_size == 1:\n            return float(torch.nn.utils.get_total_norm",
        "        if True:\n            return float(torch.nn.utils.get_total_norm",
        ("tests/trainer/test_engine_dist.py::test_zero_stage0_matches_zero3_and_resumes",),
        slow=True,
    ),
    Mutation(  # the no_prm arm's weight never reaches the score: the arm would be the baseline
        "prm_weight_ignored",
        "reward/scoring.py",
        "w_prm=cfg.w_prm, w_orm",
        "w_prm=1.0, w_orm",
        ("tests/reward/test_reward_scoring.py::test_outcome_only_arm_scores_orm_and_penalty_without_probes",),
    ),
    Mutation(  # an arm registered identical by construction runs every seed: the table's wall time grows
        "identical_arms_every_seed",
        "scripts/demo_lib/ablations.py",
        "n = min(seeds, identical_seeds) if p is not None and p.identical else seeds",
        "n = seeds",
        ("tests/config/test_ablation_predictions.py::test_identical_arms_run_one_seed_unless_asked",),
    ),
    Mutation(  # the run key compares the recipe's text: a comment edit reruns every finished ablation run
        "run_key_on_recipe_text",
        "scripts/demo_lib/ablations.py",
        'return recipe_settings(old.get("recipe", "")) == recipe_settings(key["recipe"])',
        'return old.get("recipe") == key["recipe"]',
        (
            "tests/config/test_ablation_predictions.py::test_a_finished_run_is_reused_across_a_comment_edit_not_a_value_edit",
        ),
    ),
    Mutation(  # the ablation table's intervals take a normal quantile past ten seeds: too narrow
        "normal_quantile_past_ten_seeds",
        "scripts/demo_lib/ablations.py",
        "return m, t_crit(level, n - 1) * sd / math.sqrt(n)",
        "return m, (1.96 if n > 10 else t_crit(level, n - 1)) * sd / math.sqrt(n)",
        (
            "tests/config/test_ablation_predictions.py::test_intervals_use_students_t_at_every_seed_count_and_level",
        ),
    ),
    Mutation(  # a design on fresh seeds reruns the seeds that motivated it (--first-seed ignored)
        "first_seed_ignored",
        "scripts/demo_lib/ablations.py",
        "return range(first_seed, first_seed + n)",
        "return range(n)",
        (
            "tests/config/test_ablation_predictions.py::test_a_design_on_fresh_seeds_starts_past_the_seeds_already_run",
        ),
    ),
    Mutation(  # session_share=0 still draws from the corpus's RNG: every demo's pretraining corpus changes
        "session_share_draws_at_zero",
        "data_pipeline/ledger.py",
        "            if session_share and rng.random() < session_share:",
        "            if rng.random() < session_share:",
        (
            "tests/data_pipeline/test_dp_ledger.py::test_session_episodes_copy_id_old_states_and_date_from_where_the_prompt_puts_them",
        ),
    ),
    Mutation(  # the prompt-layout copy episode dates its change by a constant, not its session header
        "session_episode_constant_date",
        "data_pipeline/ledger.py",
        'ops = [f"UPDATE {rid}: {record_text(a.name, [*states, (new, date)])}"]',
        "ops = [f\"UPDATE {rid}: {record_text(a.name, [*states, (new, '2023-02-06')])}\"]",
        (
            "tests/data_pipeline/test_dp_ledger.py::test_session_episodes_copy_id_old_states_and_date_from_where_the_prompt_puts_them",
        ),
    ),
    Mutation(  # a kill between a step's checkpoint and its metrics line loses the line for good
        "lost_metrics_line_not_restored",
        "hymem_train/stage.py",
        '        stage.logger.restore(start_step, client_state.get("step_metrics"))\n',
        "",
        ("tests/stages/test_stages_cli.py::test_rl_kill9_then_resume_reproduces_the_uninterrupted_run",),
        slow=True,
    ),
    Mutation(  # the checkpoint does not carry its step's metrics row
        "step_metrics_not_checkpointed",
        "hymem_train/checkpointing.py",
        "(scheduler.state(), dict(metrics or {}))",
        "(scheduler.state(), {})",
        ("tests/test_observability.py::test_a_checkpointed_step_whose_line_was_lost_is_restored_once",),
    ),
    Mutation(  # an actor running several rollouts is counted dead (and replaced) once per rollout it ran
        "actor_death_counted_per_rollout",
        "hymem_train/rollout/pool.py",
        "        if gen != self.gens[k]:\n            return SEEN\n",
        "",
        ("tests/rollout/test_actor_slots.py::test_a_death_reported_by_each_of_its_rollouts_counts_once",),
    ),
    Mutation(  # the held-out evaluation follows the checkpoints again, whatever eval_every says
        "eval_every_ignored",
        "hymem_train/run_config.py",
        "return step % (self.eval_every or self.save_every) == 0 or step == self.num_steps",
        "return step % self.save_every == 0 or step == self.num_steps",
        (
            "tests/config/test_stage_schema.py::test_eval_every_thins_the_held_out_evaluation_not_the_checkpoints",
        ),
    ),
    Mutation(  # every rollout actor imports datasets, pandas and pyarrow again at start-up
        "rollout_actor_imports_datasets",
        "data_pipeline/schema.py",
        "from typing import Any, ClassVar, TypeVar\n",
        "from typing import Any, ClassVar, TypeVar\n\nimport datasets  # noqa: F401\n",
        ("tests/test_layering.py::test_the_rollout_actor_imports_no_heavy_package",),
    ),
    Mutation(  # the table waits for every run before its first evaluation
        "evaluations_after_every_run",
        "scripts/demo_lib/ablations.py",
        "            for seed, fs in futures.items():\n                for f in fs:\n                    f.result()\n"
        "                if after_seed is not None:",
        "            for fs in futures.values():\n                for f in fs:\n                    f.result()\n"
        "            for seed in futures:\n                if after_seed is not None:",
        (
            "tests/config/test_ablation_predictions.py::test_a_seeds_evaluation_starts_beside_the_next_seeds_runs",
        ),
    ),
    Mutation(  # a failed run leaves the queued runs to start anyway
        "failed_run_keeps_the_queue",
        "scripts/demo_lib/ablations.py",
        "            pool.shutdown(cancel_futures=True)",
        "            pass",
        ("tests/config/test_ablation_predictions.py::test_a_failed_run_drops_the_runs_not_started",),
    ),
    Mutation(  # the stage's swap evaluation samples at the rollouts' temperature again
        "eval_swap_training_decoding",
        "hymem_train/callbacks/swap_eval.py",
        "mcfg = with_writer_decoding(mcfg)",
        "mcfg = mcfg",
        (
            "tests/stages/test_observability_cli.py::"
            "test_rl_run_logs_each_step_into_the_run_dir_and_wandb_gets_the_config",
        ),
        slow=True,
    ),
    # the vLLM engine's gate around a weight sync (silent failure request-straddles-sync); the vLLM tier's
    # test_a_sync_waits_for_requests_in_flight_and_holds_new_ones fails on each of them too, run with
    # `.venvs/vllm_cpu/bin/python scripts/mutations.py --only ... --tests <that node id>`
    Mutation(
        "sync_gate_no_drain",
        "hymem_train/engines/vllm_engine.py",
        "if not self._cv.wait_for(lambda: self.in_flight == 0, self.timeout_s):",
        "if not self._cv.wait_for(lambda: True, self.timeout_s):",
        ("tests/engines/test_sync_gate.py::test_close_waits_until_the_requests_in_the_engine_have_left",),
    ),
    Mutation(
        "sync_gate_admits_during_sync",
        "hymem_train/engines/vllm_engine.py",
        "            if self.closed:\n                self._held.append(start)\n                return\n",
        "",
        ("tests/engines/test_sync_gate.py::test_requests_that_arrive_during_a_sync_wait_for_its_end",),
    ),
    Mutation(
        "sync_gate_blocking_enter_during_sync",
        "hymem_train/engines/vllm_engine.py",
        "if not self._cv.wait_for(lambda: not self.closed, self.timeout_s):",
        "if not self._cv.wait_for(lambda: True, self.timeout_s):",
        ("tests/engines/test_sync_gate.py::test_requests_that_arrive_during_a_sync_wait_for_its_end",),
    ),
    Mutation(  # counterfactual ORM: a record the left-out chunk added stays in its view
        "counterfactual_keeps_added_records",
        "reward/counterfactual.py",
        "                continue  # the chunk added it",
        "                pass  # the chunk added it",
        ("tests/reward/test_reward_terms.py::test_leave_out_drops_added_reverts_updated_keeps_superseded",),
    ),
    Mutation(  # counterfactual ORM: every leave-out read as the full bank (no chunk is ever credited)
        "counterfactual_views_never_differ",
        "reward/service.py",
        "if t not in cf_bad and not same_view(v, q_results[j]):",
        "if False:",
        ("tests/reward/test_reward_service.py::test_counterfactual_orm_credits_the_answers_a_chunk_changes",),
    ),
    Mutation(  # counterfactual ORM: a later chunk's update is undone along with the left-out chunk's
        "counterfactual_reverts_superseded_updates",
        "reward/counterfactual.py",
        "            if e.text == after_text.get(e.id):",
        "            if True:",
        ("tests/reward/test_reward_terms.py::test_leave_out_drops_added_reverts_updated_keeps_superseded",),
    ),
)


def _git_clean(path: str) -> bool:
    return subprocess.run(["git", "diff", "--quiet", "--", path], cwd=ROOT).returncode == 0


def _run_tests(tests: tuple[str, ...]) -> dict[str, str]:
    """node id -> 'passed' | 'skipped' | 'failed: <first line of the failure>'."""
    with tempfile.TemporaryDirectory() as d:
        xml = Path(d) / "junit.xml"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *tests]
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not xml.exists():
            return {t: "failed: pytest wrote no report" for t in tests}
        out: dict[str, str] = {}
        for case in ET.parse(xml).iter("testcase"):
            node = f"{case.get('file') or case.get('classname', '').replace('.', '/') + '.py'}::{case.get('name')}"
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            if bad is not None:
                msg = (bad.get("message") or bad.text or "").strip().splitlines()
                out[node] = "failed: " + (msg[0][:150] if msg else "?")
            elif case.find("skipped") is not None:
                out[node] = "skipped"
            else:
                out[node] = "passed"
    # match junit names back to the node ids we asked for (parametrized ids map to several cases)
    result = {}
    for t in tests:
        if "::" not in t:  # a file or folder: every case under it
            result.update({k: v for k, v in out.items() if k.startswith(t.rstrip("/"))})
            continue
        base = t.split("::")[-1]
        hits = [v for k, v in out.items() if k.split("::")[-1].split("[")[0] == base.split("[")[0]]
        if not hits:
            result[t] = "failed: not collected"
        elif any(h == "passed" for h in hits):
            result[t] = "passed"
        elif all(h == "skipped" for h in hits):
            result[t] = "skipped"
        else:
            result[t] = next(h for h in hits if h.startswith("failed"))
    return result


def apply(m: Mutation, tests: tuple[str, ...] | None = None) -> dict[str, str]:
    """Mutate, run the named tests (or `tests`), restore."""
    f = ROOT / m.path
    text = f.read_text()
    if text.count(m.original) != 1:
        raise SystemExit(f"{m.name}: original snippet occurs {text.count(m.original)} times in {m.path}")
    if not _git_clean(m.path):
        raise SystemExit(f"{m.name}: {m.path} has uncommitted changes; commit or stash them first")
    try:
        f.write_text(text.replace(m.original, m.mutated))
        return _run_tests(tests or m.tests)
    finally:
        f.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None, help="mutation names")
    ap.add_argument("--fast", action="store_true", help="skip mutations whose tests are slow")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--tests", nargs="*", default=None, help="run these tests instead of the named ones")
    args = ap.parse_args()
    chosen = [
        m for m in MUTATIONS if (args.only is None or m.name in args.only) and not (args.fast and m.slow)
    ]
    if args.only and (unknown := set(args.only) - {m.name for m in MUTATIONS}):
        raise SystemExit(f"unknown mutation(s): {sorted(unknown)}")
    if args.list:
        for m in chosen:
            print(f"{m.name:45s} {m.path}  ->  {', '.join(m.tests)}")
        return 0
    survived = dirty = 0
    rows = []
    try:
        for m in chosen:
            t0 = time.monotonic()
            res = apply(m, tuple(args.tests) if args.tests else None)
            caught = all(v.startswith("failed") for v in res.values())
            verdict = "CAUGHT" if caught else ("UNTESTED" if "skipped" in res.values() else "SURVIVED")
            survived += verdict != "CAUGHT"
            rows.append((m.name, verdict, time.monotonic() - t0, res))
            print(f"{verdict:8s} {m.name} ({time.monotonic() - t0:.0f} s)", flush=True)
            for t, v in res.items():
                print(f"    {t}: {v}", flush=True)
    finally:
        not_restored = sorted({m.path for m in chosen if not _git_clean(m.path)})
        if not_restored:
            print(f"ERROR: files not restored: {not_restored}", file=sys.stderr)
            dirty = 1
    print(f"\n{len(rows) - survived} of {len(rows)} mutations caught by their named tests")
    return 1 if survived or dirty else 0


if __name__ == "__main__":
    sys.exit(main())
