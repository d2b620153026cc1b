"""Stage 1: On-Policy Distillation (report section OPD).

    python -m hymem_train.opd +exp=demo_cpu                     # tiny models, native harness, CPU
    sbatch slurm/ray_job.sbatch hymem_train.opd +exp=hy_memory_opd

Each step: the student writes windows inside the harnesses (2 rollouts per row); the frozen teacher
scores every segment the student sampled (top-50 log-probs per position); the student minimises the
reverse KL over the teacher's support (+ entropy bonus); weights sync to the rollout engine.
"""

from __future__ import annotations

import logging

import hydra
import numpy as np
from omegaconf import DictConfig

from hymem_train.config import CONFIG_DIR, to_typed
from hymem_train.engines import build_engine
from hymem_train.run_config import OpdConfig
from hymem_train.runtime import Runtime, eval_tasks
from hymem_train.trainer.items import opd_items
from hymem_train.trainer.packing import TrainItem

log = logging.getLogger(__name__)


def teacher_items(results, teacher, k: int) -> list[TrainItem]:
    """Teacher top-k over every segment of every usable rollout (platform failures are excluded);
    `opd_items` raises on a missing or short teacher answer (silent failure 2)."""
    segs = [s for r in results if r.record.status != "platform_error" for s in r.segments]
    if not segs:
        return []
    return opd_items(segs, teacher.topk_logprobs([s.input_ids for s in segs], k))


def collect(
    rt: Runtime, teacher, cfg: OpdConfig, step: int
) -> tuple[list[TrainItem], dict[str, float], list]:
    windows = rt.scheduler.next_windows(cfg.opd.num_rows_per_step)
    with rt.timer("rollout"):
        results = rt.run_rollouts(rt.rollout_tasks(windows, cfg.opd.num_rollouts_per_row, step))
    rt.record_bank_sizes(step, windows, results, cfg.opd.num_rollouts_per_row)
    with rt.timer("teacher"):
        items = teacher_items(results, teacher, cfg.opd.teacher_top_k)
    m = {k: sum(r.metrics.get(k, 0.0) for r in results) for k in results[0].metrics} if results else {}
    # OPD has no reward: each row's first rollout that did not fail on the platform carries the bank on
    done = []
    for j, sw in enumerate(windows):
        group = results[j * cfg.opd.num_rollouts_per_row : (j + 1) * cfg.opd.num_rollouts_per_row]
        ok = [r for r in group if r.record.status != "platform_error"]
        if ok:
            rt.promote(sw, ok[0])
            done.append(sw)
    m["rollout/windows_done"] = float(len(done))
    return items, m, done


def evaluate(rt: Runtime, teacher, cfg: OpdConfig, step: int) -> dict[str, float]:
    """Held-out reverse KL(student || teacher) over the full vocabulary at the student's sampled positions."""
    from data_pipeline.store import BuiltDataset

    ds = BuiltDataset(cfg.data.eval_path)
    results = rt.run_rollouts(eval_tasks(rt, ds, 1, step, next(iter(cfg.harnesses))))
    segs = [s for r in results for s in r.segments]
    if not segs:
        return {}
    V = rt.engine.model.config.vocab_size
    kls = []
    for s, st, tt in zip(segs, rt.engine.topk_logprobs([s.input_ids for s in segs], V),
                         teacher.topk_logprobs([s.input_ids for s in segs], V), strict=True):  # fmt: skip
        P, R = len(s.prompt_ids), len(s.response_ids)
        ls = np.take_along_axis(st.logprobs_TK.numpy(), np.argsort(st.ids_TK.numpy(), 1), 1)[
            P - 1 : P + R - 1
        ]
        lt = np.take_along_axis(tt.logprobs_TK.numpy(), np.argsort(tt.ids_TK.numpy(), 1), 1)[
            P - 1 : P + R - 1
        ]
        kls.append((np.exp(ls) * (ls - lt)).sum(-1))
    kl = np.concatenate(kls)
    return {"eval/reverse_kl": float(kl.mean()), "eval/num_positions": float(kl.size)}


def run(cfg: OpdConfig) -> dict[str, float]:
    rt = Runtime(cfg)
    try:
        teacher = build_engine(cfg.teacher_engine, cfg.teacher, rt.tokenizer) if rt.is_driver else None

        def kl(m: dict[str, float]) -> None:
            # the loss is the truncated reverse KL minus the entropy bonus: log the KL itself
            m["distill/reverse_kl_topk"] = (
                m["train/loss"] + cfg.trainer.loss.entropy_coef * m["distill/entropy"]
            )

        last = rt.steps(
            collect=lambda step: collect(rt, teacher, cfg, step),
            evaluate=lambda step: evaluate(rt, teacher, cfg, step),
            loss_kind="opd",
            derive=kl,
        )
        if rt.is_driver:
            rt.logger.plot(["distill/reverse_kl_topk", "eval/reverse_kl", "distill/teacher_token_coverage",
                            "distill/entropy"], "opd_curves.png")  # fmt: skip
    except BaseException:
        rt.close(failed=True)
        raise
    rt.close()
    return last


@hydra.main(config_path=CONFIG_DIR, config_name="opd", version_base=None)
def main(dcfg: DictConfig) -> None:
    run(to_typed(dcfg, OpdConfig))


if __name__ == "__main__":
    main()
