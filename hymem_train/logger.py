"""Run observability: namespaced metrics to wandb (offline by default) and to `metrics.jsonl` in the
run directory, a per-step time breakdown, and PNG plots of the main curves.

wandb run identity: a new run gets a fresh id (`<run name>-<8 hex>`), recorded in
`<run dir>/wandb_run_id`; only a resumed stage reuses the recorded id (`resume="allow"`), so a re-run
under the same name never merges into the old run's charts."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from hymem_train.config import LoggingConfig

log = logging.getLogger(__name__)

# the metrics of the one console line per logged step (the full set is in metrics.jsonl and wandb)
CONSOLE_KEYS = (
    "train/loss",
    "train/clipfrac",
    "train/grad_norm",
    "distill/reverse_kl_topk",
    "reward/s",
    "eval/",
    "rollout/windows_done",
    "perf/time_step_s",
)


class StepTimer:
    """`with timer("rollout"): ...` accumulates seconds per phase; `pop()` returns perf/time_* metrics:
    one per phase, `perf/time_step_s` (their sum) and, once `mark()` has started the clock,
    `perf/time_wall_s`: wall seconds since the last mark or pop, i.e. the whole loop iteration, so the
    untimed work (scheduling, promotion, the previous step's logging) shows as wall minus phases.
    `last(phase)` is the phase's latest (start, end) this step, (0, 0) if it did not run."""

    def __init__(self) -> None:
        self._t: dict[str, float] = defaultdict(float)
        self._last: dict[str, tuple[float, float]] = {}
        self._since: float | None = None

    def mark(self) -> None:
        """Start the wall clock (the step loops call it once, before their first step)."""
        self._since = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            self._t[phase] += t1 - t0
            self._last[phase] = (t0, t1)

    def last(self, phase: str) -> tuple[float, float]:
        return self._last.get(phase, (0.0, 0.0))

    def add(self, phase: str, seconds: float) -> None:
        """Seconds a phase took elsewhere (a batch collected while the previous step trained)."""
        self._t[phase] += seconds

    def pop(self) -> dict[str, float]:
        now = time.perf_counter()
        out = {f"perf/time_{k}_s": v for k, v in self._t.items()}
        out["perf/time_step_s"] = sum(self._t.values())
        if self._since is not None:
            out["perf/time_wall_s"] = now - self._since
            self._since = now
        self._t.clear()
        self._last.clear()
        return out


WANDB_ID_FILE = "wandb_run_id"


def wandb_run_id(run_dir: Path, run_name: str, resume: bool) -> tuple[str, bool]:
    """(id, resumes): the id recorded in the run directory when `resume` and there is one; else a
    fresh id, recorded for a later resume."""
    path = run_dir / WANDB_ID_FILE
    if resume and path.exists() and (old := path.read_text().strip()):
        return old, True
    new = f"{run_name.replace('/', '_')}-{secrets.token_hex(4)}"
    path.write_text(new + "\n")
    return new, False


class MetricsLogger:
    def __init__(
        self,
        cfg: LoggingConfig,
        run_dir: str | Path,
        run_name: str,
        config: dict | None = None,
        *,
        resume: bool = False,
    ):
        """`config`: the run's resolved config (wandb's run config); `resume`: the stage resumed from
        a checkpoint, so the wandb run recorded in the run directory continues."""
        self.cfg = cfg
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self._wandb = None
        self.wandb_id = ""
        if cfg.wandb_mode != "disabled":
            self.wandb_id, resumes = wandb_run_id(self.dir, run_name, resume)
            try:
                import wandb

                os.environ.setdefault("WANDB_SILENT", "true")
                self._wandb = wandb.init(
                    project=cfg.project,
                    entity=cfg.entity or None,
                    name=run_name,
                    dir=str(self.dir),
                    mode=cfg.wandb_mode,
                    config=config or {},
                    id=self.wandb_id,
                    resume="allow" if resumes else None,
                )
            except Exception as e:  # logging must never kill a training run
                log.warning("wandb unavailable (%s); metrics go to %s only", e, self.path)

    def log(self, step: int, metrics: dict[str, float], *, force: bool = False) -> None:
        """Every step goes to metrics.jsonl (the run's record; plots read it). Every
        `logging.log_every`-th step, and any `force`d one, also goes to wandb and to one console line."""
        clean = {
            k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(float(v))
        }
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")
        if not (force or step % self.cfg.log_every == 0):
            return
        log.info(
            "step %d %s",
            step,
            " ".join(f"{k}={v:.4g}" for k, v in sorted(clean.items()) if k.startswith(CONSOLE_KEYS)),
        )
        if self._wandb is not None:
            self._wandb.log(clean, step=step)

    def restore(self, step: int, metrics: dict[str, float] | None) -> bool:
        """On resume: write the checkpointed step's row if a kill between its checkpoint and its log
        line lost it (the resumed run never redoes that step). The row is the step's training, reward
        and held-out metrics, without the checkpoint's seconds or the side jobs' metrics, and says
        `run/restored=1`. Returns whether it wrote one."""
        if not step or not metrics or any(r["step"] == step for r in self.history()):
            return False
        self.log(step, {**metrics, "run/restored": 1.0}, force=True)
        log.warning("step %d's metrics line was lost by a kill after its checkpoint: restored from it", step)
        return True

    def history(self) -> list[dict]:
        if not self.path.exists():
            return []
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        by_step = {r["step"]: r for r in rows}  # a resumed run rewrites a step: the last line wins
        return [by_step[s] for s in sorted(by_step)]

    def plot(self, keys: list[str], name: str = "curves.png") -> Path | None:
        rows = self.history()
        keys = [k for k in keys if any(k in r for r in rows)]
        if not keys:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(keys), 1, figsize=(6, 2.4 * len(keys)), squeeze=False)
        for ax, k in zip(axes[:, 0], keys, strict=True):
            pts = [(r["step"], r[k]) for r in rows if k in r]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3)
            ax.set_title(k, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        out = self.dir / name
        fig.savefig(out, dpi=90)
        plt.close(fig)
        return out

    def finish(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
