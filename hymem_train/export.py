"""Export a training checkpoint as an HF directory that transformers and vLLM's HYV3 loader read.

    python -m hymem_train.export checkpoint=runs/hy_memory_rl/checkpoints/step_200 out_dir=runs/export/rl200
    python -m hymem_train.export checkpoint=runs/hy_memory_opd/final out_dir=... dtype=float32
    python -m hymem_train.export checkpoint=... out_dir=... push_to_hub=owner/name   # then uploads

`checkpoint` is a DeepSpeed step checkpoint (`<run>/checkpoints/step_N`, consolidated on this one
process parameter by parameter) or an HF directory. Output: safetensors shards + index, config.json
(with every key vLLM's HYV3 model reads), tokenizer, generation_config.json and a model card
(README.md: stage, step, the run's config, its last held-out metrics, how to serve). docs/export.md.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from hymem_train.config import CONFIG_DIR, to_typed
from hymem_train.run_config import ExportConfig

log = logging.getLogger(__name__)


def push_to_hub(out_dir: Path, repo: str) -> str:
    """Upload `out_dir` to the Hub repo `repo` (created if missing); needs network and a token."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo, exist_ok=True)
    return str(api.upload_folder(folder_path=str(out_dir), repo_id=repo, commit_message="hymem-train export"))


def run(cfg: ExportConfig) -> Path:
    from hymem_train.trainer.export import export_checkpoint

    out = export_checkpoint(
        cfg.checkpoint,
        cfg.out_dir,
        dtype=cfg.dtype,
        fallback_model=cfg.model,
        max_shard_bytes=cfg.max_shard_mb * 10**6,
        served_model_name=cfg.served_model_name,
    )
    print(f"exported {cfg.checkpoint} -> {out}")
    if cfg.push_to_hub:
        print(f"pushed to {push_to_hub(out, cfg.push_to_hub)}")
    return out


@hydra.main(config_path=CONFIG_DIR, config_name="export", version_base=None)
def main(dcfg: DictConfig) -> None:
    run(to_typed(dcfg, ExportConfig))


if __name__ == "__main__":
    main()
