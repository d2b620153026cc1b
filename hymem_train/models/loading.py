"""Model/tokenizer loading from config: a local checkpoint path or a preset built from config.

No hub: `from_pretrained` always runs with local_files_only=True.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hymem_train.models.presets import PRESETS, build_model, make_config

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelConfig:
    preset: str = "tiny"  # PRESETS name, used when `path` is empty
    path: str = ""  # local HF checkpoint directory; wins over `preset`
    tokenizer_path: str = ""  # local tokenizer directory; empty = the shipped one (assets/tokenizer)
    dtype: str = "float32"  # float32 on CPU, bfloat16 on GPU
    attn_implementation: str = "sdpa"  # sdpa | eager | flash_attention_2
    seed: int = 0  # init seed for presets

    def validate(self) -> None:
        if not self.path and self.preset not in PRESETS:
            raise ValueError(f"model.preset {self.preset!r} unknown; known: {sorted(PRESETS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype {self.dtype!r} not in {sorted(DTYPES)}")


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
