"""Stage 2: attributed memory RL with chunk-level GRPO (report section RL).

    python -m hymem_train.rl +exp=demo_rl init_checkpoint=runs/demo/opd/final
    sbatch slurm/ray_job.sbatch hymem_train.rl +exp=hy_memory_rl

Each step: 8 rollouts per window from independent copies of the parent bank; the reward service
scores every chunk (probes + traps after each chunk, gold-fact attributed ORM after the window, the
growth penalty) into chunk-level GRPO advantages; the best rollout's bank is promoted; PPO (no KL)
with routing replay updates the policy; weights sync to the rollout engine.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import hydra
import numpy as np
from omegaconf import DictConfig

from hymem_train.config import CONFIG_DIR, to_typed
from hymem_train.run_config import RlConfig
from hymem_train.runtime import Runtime, eval_tasks
from hymem_train.trainer.items import rl_items
from hymem_train.trainer.packing import TrainItem
from reward.records import RolloutGroup

log = logging.getLogger(__name__)


def make_groups(rt: Runtime, windows, results, num_rollouts: int, dataset) -> list[RolloutGroup]:
    groups = []
    for j, sw in enumerate(windows):
        w = sw.window
        recs = [r.record for r in results[j * num_rollouts : (j + 1) * num_rollouts]]
        parent_size = rt.lineage.parent_size_tokens(w.sequence_id, sw.epoch, w.index) if sw.epoch >= 0 else 0
        groups.append(
            RolloutGroup(w, sw.harness, parent_size, recs, dataset.probes_of(w), dataset.questions_of(w))
        )
    return groups


def advantage_items(results, scored, num_rollouts: int) -> list[TrainItem]:
    """Every kept segment of every usable rollout with its chunk's advantage A[i, t]; `rl_items`
    raises for a segment whose chunk has no advantage (silent failure 3)."""
    adv: dict[tuple[str, int], float] = {}
    segs = []
    for j, g in enumerate(scored):
        for i, r in enumerate(results[j * num_rollouts : (j + 1) * num_rollouts]):
            if r.record.status == "platform_error":
                continue  # excluded from the group's statistics and from training (silent failure 7)
            for t, c in enumerate(g.chunk_indices):
                adv[(r.record.trajectory_id, c)] = g.scores.adv_GC[i][t]
            segs += r.segments
    return rl_items(segs, adv)


def reduce_metrics(results, scored) -> dict[str, float]:
    m: dict[str, float] = defaultdict(float)
    for r in results:
        for k, v in r.metrics.items():
            m[k] += v
    per_group = defaultdict(list)
    for g in scored:
        for k, v in g.metrics.items():
            per_group[k].append(v)
    for k, vs in per_group.items():
        # call and fault counters are sums over groups; the other reward/* are per-group means
        m[k] = float(np.sum(vs)) if k.endswith(("_calls", "_faults", "_retries")) else float(np.mean(vs))
    return dict(m)


def collect(rt: Runtime, reward, cfg: RlConfig, step: int):
    windows = rt.scheduler.next_windows(cfg.rl.num_windows_per_step)
    G = cfg.rl.num_rollouts_per_window
    with rt.timer("rollout"):
        results = rt.run_rollouts(rt.rollout_tasks(windows, G, step))
    rt.record_bank_sizes(step, windows, results, G)
    with rt.timer("reward"):
        scored = reward.score_groups(make_groups(rt, windows, results, G, rt.dataset))
    items = advantage_items(results, scored, G)
    done = []
    for j, (sw, g) in enumerate(zip(windows, scored, strict=True)):
        if g.best_rollout is None:  # no valid rollout: the window is retried next step, lineage unchanged
            continue
        rt.promote(sw, results[j * G + g.best_rollout])  # highest sum of chunk scores (report)
        done.append(sw)
    m = reduce_metrics(results, scored)
    m["rollout/windows_done"] = float(len(done))
    return items, m, done


def evaluate(rt: Runtime, reward, cfg: RlConfig, step: int) -> dict[str, float]:
    """Held-out sequences: mean per-chunk reward terms of `rl.num_eval_rollouts` rollouts per first
    window, from empty banks."""
    from data_pipeline.store import BuiltDataset
    from hymem_train.rollout.scheduler import ScheduledWindow

    ds = BuiltDataset(cfg.data.eval_path)
    harness = next(iter(cfg.harnesses))
    n = cfg.rl.num_eval_rollouts
    results = rt.run_rollouts(eval_tasks(rt, ds, n, step, harness))
    firsts = [ScheduledWindow(w, harness, -1) for w in ds.windows if w.index == 0]
    scored = reward.score_groups(make_groups(rt, firsts, results, n, ds))
    vals = defaultdict(list)
    for g in scored:
        s = g.scores
        for name in ("prm", "orm", "pen", "s"):
            arr = np.asarray(getattr(s, f"{name}_GC"), dtype=float)
            valid = np.asarray(s.valid_GC, dtype=bool)
            vals[name] += list(arr[valid])
    return {f"eval/{k}": float(np.mean(v)) for k, v in vals.items() if v}


class HarnessRewards:
    """One reward service per declared harness configuration (a reward actor searches banks through one
    harness); groups are routed by their harness and results come back in group order."""

    def __init__(self, cfg: RlConfig, run_dir, manifest, embedder=None):
        from hymem_train.rollout.harness_factory import BankReaderFactory
        from reward.service import RewardService

        self.services = {
            name: RewardService(cfg.reward, BankReaderFactory(h, run_dir, embedder), manifest=manifest)
            for name, h in cfg.harnesses.items()
        }

    def score_groups(self, groups: list[RolloutGroup]):
        out: list = [None] * len(groups)
        for name, svc in self.services.items():
            idx = [i for i, g in enumerate(groups) if g.harness == name]
            if idx:
                for i, r in zip(idx, svc.score_groups([groups[i] for i in idx]), strict=True):
                    out[i] = r
        missing = [groups[i].harness for i, r in enumerate(out) if r is None]
        if missing:  # silent failure 4: a group of an undeclared harness must not pass unscored
            raise ValueError(f"no reward service for harness(es) {sorted(set(missing))}")
        return out

    def shutdown(self) -> None:
        for svc in self.services.values():
            svc.shutdown()


def run(cfg: RlConfig) -> dict[str, float]:
    rt = Runtime(cfg, growth_bounds=cfg.reward.scoring.growth_bounds)
    reader_server = reward = None
    try:
        if rt.is_driver:
            if cfg.local_reader:
                reader_server = start_local_reader(rt, cfg)
            reward = HarnessRewards(cfg, rt.run_dir, rt.dataset.manifest, rt.reader_embedder)
        last = rt.steps(
            collect=lambda step: collect(rt, reward, cfg, step),
            evaluate=lambda step: evaluate(rt, reward, cfg, step),
            loss_kind="ppo",
        )
        if rt.is_driver:
            rt.logger.plot(["reward/s", "reward/prm", "reward/orm", "reward/pen", "eval/s", "train/clipfrac",
                            "reward/zero_advantage_share"],
                           "rl_curves.png")  # fmt: skip
    except BaseException:
        _stop(reward, reader_server)
        rt.close(failed=True)
        raise
    _stop(reward, reader_server)
    rt.close()
    return last


def _stop(reward, reader_server) -> None:
    if reward is not None:
        reward.shutdown()
    if reader_server is not None:
        reader_server.stop()


def start_local_reader(rt: Runtime, cfg: RlConfig):
    """CPU boxes: the frozen reader served by an HF engine behind a frozen-mode gateway."""
    import dataclasses

    from hymem_train.engines import EngineConfig, build_engine
    from hymem_train.gateway.runner import GatewayServer
    from hymem_train.gateway.server import Gateway, GatewayConfig

    eng = build_engine(EngineConfig(capture_routes=False, max_model_len=cfg.engine.max_model_len), cfg.reader_model,
                       rt.tokenizer)  # fmt: skip
    gw = Gateway(
        eng,
        rt.tokenizer,
        GatewayConfig(frozen=True, embeddings=False, served_model_name=cfg.reward.reader.model),
    )
    server = GatewayServer(gw).start()
    cfg.reward = dataclasses.replace(
        cfg.reward, reader=dataclasses.replace(cfg.reward.reader, base_url=server.base_url)
    )
    return server


@hydra.main(config_path=CONFIG_DIR, config_name="rl", version_base=None)
def main(dcfg: DictConfig) -> None:
    run(to_typed(dcfg, RlConfig))


if __name__ == "__main__":
    main()
