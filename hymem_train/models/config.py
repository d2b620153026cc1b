"""ModelConfig: which policy/teacher/reader model to load (no torch import here)."""

from __future__ import annotations

from dataclasses import dataclass

from hymem_train.models.preset_table import PRESETS

DTYPE_NAMES = ("float32", "bfloat16", "float16")


@dataclass
class ModelConfig:
    preset: str = "tiny"  # PRESETS name, used when `path` is empty
    path: str = ""  # local HF checkpoint directory; wins over `preset`
    tokenizer_path: str = ""  # local tokenizer directory; empty = the shipped one (assets/tokenizer)
    dtype: str = "float32"  # float32 on CPU, bfloat16 on GPU
    attn_implementation: str = "sdpa"  # sdpa | eager | flash_attention_2
    seed: int = 0  # init seed for presets

    def validate(self) -> None:
        if not self.path and self.preset not in _preset_names():
            raise ValueError(f"model.preset {self.preset!r} unknown; known: {_preset_names()}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"model.dtype {self.dtype!r} not in {sorted(DTYPE_NAMES)}")


def _preset_names() -> list[str]:
    return sorted(PRESETS)
