"""Supervised fine-tuning on the trainer core: makes the demo's tiny teacher, and the report's "OPD init
vs generic SFT" ablation. Cross-entropy on response tokens of packed segments, ZeRO-3 engine.

    .venv/bin/python -m hymem_train.sft data_path=runs/data/sft.jsonl out_dir=runs/sft
    .venv/bin/torchrun --nproc_per_node 2 -m hymem_train.sft data_path=... # 2 ranks (gloo on CPU)

Data: JSONL, one record per line: a full Segment (`Segment.to_json`), just
`{"prompt_ids": [...], "response_ids": [...]}` (loss on the response), or `{"text_ids": [...]}`: plain
language modelling, loss on every token after the first (the demo's pretraining stand-in). Output: `out_dir/checkpoints` (resumable, picked up
automatically), `out_dir/metrics.jsonl`, and `out_dir/final` (HF checkpoint + tokenizer, loadable
with `model.path=...`).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from omegaconf import DictConfig

from hymem_train.config import CONFIG_DIR, register_schema, to_typed
from hymem_train.models.config import ModelConfig
from hymem_train.segments import Segment
from hymem_train.trainer.config import TrainerConfig
from hymem_train.trainer.engine import Trainer, load_trainer_model
from hymem_train.trainer.export import export_hf
from hymem_train.trainer.packing import TrainItem, plan_step

log = logging.getLogger(__name__)


@dataclass
class SftConfig:
    data_path: str  # JSONL of segments (see module docstring)
    trainer: TrainerConfig  # configs/trainer/sft.yaml
    model: ModelConfig = field(default_factory=ModelConfig)  # configs/model/*.yaml
    out_dir: str = "runs/sft"  # checkpoints, metrics.jsonl, final/
    num_epochs: int = 1  # passes over the data
    num_segments_per_step: int = 8  # segments per optimizer step (all ranks together)
    save_every: int = 0  # checkpoint every N steps (0 = only at the end)
    max_steps: int = 0  # stop after N steps in total (0 = run all epochs)
    # the lr decays linearly toward 0 over the last N epochs (0: constant). A run stopped before them
    # (num_epochs - N epochs) is exactly the constant-lr run, so it can serve as a checkpoint on the way.
    anneal_epochs: int = 0

    def validate(self) -> None:
        self.model.validate()
        self.trainer.validate()
        if self.trainer.loss.kind != "sft":
            raise ValueError(f"trainer.loss.kind={self.trainer.loss.kind!r}: the SFT entry point needs 'sft'")
        if self.num_segments_per_step < 1 or self.num_epochs < 1:
            raise ValueError("num_segments_per_step and num_epochs must be >= 1")
        if not 0 <= self.anneal_epochs <= self.num_epochs:
            raise ValueError(
                f"anneal_epochs={self.anneal_epochs}: want 0 <= anneal_epochs <= num_epochs={self.num_epochs}"
            )


register_schema("sft", SftConfig)


def load_segments(path: str) -> list[Segment]:
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                if "text_ids" in d:  # plain LM: the first token has nothing before it to predict it
                    ids = d.pop("text_ids")
                    if len(ids) < 2 or d:
                        raise ValueError("a text_ids record needs >= 2 ids and no other fields")
                    d = {"prompt_ids": ids[:1], "response_ids": ids[1:]}
                if "trajectory_id" not in d:
                    d = {
                        "trajectory_id": f"{Path(path).name}:{n}",
                        "chunk_index": 0,
                        "call_index": 0,
                        "prompt_ids": d["prompt_ids"],
                        "response_ids": d["response_ids"],
                        "logprobs": [0.0] * len(d["response_ids"]),
                        "finish_reason": "stop",
                    }
                out.append(Segment.from_dict(d))
            except (KeyError, ValueError, TypeError) as e:
                raise ValueError(f"{path}:{n}: bad SFT record: {e}") from None
    if not out:
        raise ValueError(f"{path}: no SFT records")
    return out


def step_batches(segments: list[Segment], cfg: SftConfig) -> list[list[Segment]]:
    """Deterministic epoch shuffles cut into steps; the data cursor is an index into this list."""
    steps = []
    for epoch in range(cfg.num_epochs):
        order = list(range(len(segments)))
        random.Random(cfg.trainer.seed * 1000 + epoch).shuffle(order)
        for s in range(0, len(order), cfg.num_segments_per_step):
            steps.append([segments[i] for i in order[s : s + cfg.num_segments_per_step]])
    return steps[: cfg.max_steps] if cfg.max_steps else steps


def lr_factor(num_segments: int, cfg: SftConfig):
    """The lr multiplier of optimizer step k: 1, then over the last `anneal_epochs` epochs linear from 1 to
    1/(their steps) at the last step. Counted on the whole epoch schedule (max_steps does not move it)."""
    per_epoch = -(-num_segments // cfg.num_segments_per_step)
    total, anneal = cfg.num_epochs * per_epoch, cfg.anneal_epochs * per_epoch
    if anneal == 0:
        return None
    return lambda k: 1.0 if k < total - anneal else max(total - k, 1) / anneal


def run(cfg: SftConfig) -> dict[str, float]:
    out_dir, ckpt_dir = Path(cfg.out_dir), Path(cfg.out_dir) / "checkpoints"
    segments = load_segments(cfg.data_path)
    trainer = Trainer(
        cfg.trainer, load_trainer_model(cfg.model, cfg.trainer), lr_factor=lr_factor(len(segments), cfg)
    )
    steps = step_batches(segments, cfg)
    cursor = trainer.load(str(ckpt_dir))["data_cursor"] if (ckpt_dir / "latest").exists() else 0
    metrics: dict[str, float] = {}
    for s in range(cursor, len(steps)):
        items = [TrainItem(segment=seg) for seg in steps[s]]
        plan = plan_step(items, cfg.trainer.packing, "sft", world_size=trainer.world_size)
        metrics = trainer.train_step(plan[trainer.rank])
        if trainer.rank == 0:
            log.info("step %d %s", s, " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
            with open(out_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": s, **metrics}) + "\n")
        if cfg.save_every and (s + 1) % cfg.save_every == 0 and s + 1 < len(steps):
            trainer.save(str(ckpt_dir), {"data_cursor": s + 1})
    if cursor < len(steps):
        trainer.save(str(ckpt_dir), {"data_cursor": len(steps)})
    export_hf(trainer, cfg.model, out_dir / "final")
    trainer.close()
    return metrics


@hydra.main(config_path=CONFIG_DIR, config_name="sft", version_base=None)
def main(dcfg: DictConfig) -> None:
    cfg = to_typed(dcfg, SftConfig)
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    run(cfg)


if __name__ == "__main__":
    main()
