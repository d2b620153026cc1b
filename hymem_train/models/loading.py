"""Model/tokenizer loading from config: a local checkpoint path or a preset built from config.

No hub: `from_pretrained` always runs with local_files_only=True.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hymem_train.models.config import ModelConfig
from hymem_train.models.presets import build_model, make_config

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def require_local_dir(path: str, key: str) -> None:
    """A start-up error that names the config key when a local checkpoint directory is missing
    (instead of transformers' "Repo id must be in the form ..."). A name that could be a hub repo id
    ("name" or "namespace/name") is left to `from_pretrained` (it may sit in the local HF cache)."""
    p = Path(path).expanduser()
    could_be_repo_id = not path.startswith(("/", ".", "~")) and path.count("/") <= 1
    if path and not p.exists() and not could_be_repo_id:
        raise FileNotFoundError(
            f"{key}={path!r}: no such directory. It must be a local HF checkpoint directory (this "
            f"codebase never downloads); set {key} to one, e.g. the `final/` directory of an earlier stage."
        )


def load_model(cfg: ModelConfig):
    from transformers import HYV3ForCausalLM

    require_local_dir(cfg.path, "model.path")
    cfg.validate()
    if cfg.path:
        return HYV3ForCausalLM.from_pretrained(
            cfg.path,
            local_files_only=True,
            dtype=DTYPES[cfg.dtype],
            attn_implementation=cfg.attn_implementation,
        )
    return build_model(
        make_config(cfg.preset, attn_implementation=cfg.attn_implementation), cfg.seed, DTYPES[cfg.dtype]
    )


def load_tokenizer_for(cfg: ModelConfig):
    from hymem_train.models.tokenizer import ASSET_DIR, load_tokenizer

    key = "model.tokenizer_path" if cfg.tokenizer_path else "model.path" if cfg.path else ""
    return load_tokenizer(cfg.tokenizer_path or cfg.path or ASSET_DIR, key=key)
