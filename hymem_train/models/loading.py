"""Model/tokenizer loading from config: a local checkpoint path or a preset built from config.

No hub: `from_pretrained` always runs with local_files_only=True.
"""

from __future__ import annotations

import torch

from hymem_train.models.config import ModelConfig
from hymem_train.models.presets import build_model, make_config

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(cfg: ModelConfig):
    from transformers import HYV3ForCausalLM

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

    return load_tokenizer(cfg.tokenizer_path or cfg.path or ASSET_DIR)
