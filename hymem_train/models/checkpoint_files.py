"""What a checkpoint path on disk is, and its weights one tensor at a time.

Two kinds of directory hold a policy:

- an HF directory (`<run>/final`, an export): `config.json` plus safetensors;
- a DeepSpeed step checkpoint written by `Trainer.save` (`<run>/checkpoints/step_N`, or the
  `<run>/checkpoints` folder itself, which names its newest tag in `latest`). It holds no model
  config: the architecture comes from the run's `config.yaml` (its `init_checkpoint` or `model`).

Step checkpoints are read on one process with DeepSpeed's own consolidation
(`zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(..., lazy_mode=True)`): the ranks'
fp32 partition files are memory-mapped and each parameter is assembled from its N slices only when
asked for, so the reader never builds the full state dict (docs/export.md). A ZeRO-0 checkpoint
holds the whole module in `mp_rank_00_model_states.pt`, memory-mapped likewise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hymem_train.models.config import ModelConfig

log = logging.getLogger(__name__)

HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_DS_PREFIX = "model."  # the engine wraps PolicyLoss, whose `model` attribute is the HF model


class CheckpointPathError(ValueError):
    """A path given as a checkpoint is neither an HF directory nor a DeepSpeed step checkpoint."""


def is_hf_dir(path: str | Path) -> bool:
    p = Path(path)
    return (p / "config.json").is_file() and any((p / f).is_file() for f in HF_WEIGHT_FILES)


def step_dir_of(path: str | Path) -> Path | None:
    """The step directory of a DeepSpeed checkpoint path (a step dir, or a save dir with `latest`)."""
    p = Path(path)
    if p.is_dir() and any(p.glob("*model_states.pt")):
        return p
    if (p / "latest").is_file():
        tag = (p / "latest").read_text().strip()
        if any((p / tag).glob("*model_states.pt")):
            return p / tag
    return None


def checkpoint_kind(path: str | Path) -> str:
    """'hf' or 'deepspeed'; CheckpointPathError naming what was looked for otherwise."""
    if is_hf_dir(path):
        return "hf"
    if step_dir_of(path) is not None:
        return "deepspeed"
    raise CheckpointPathError(
        f"{path}: not a checkpoint. Expected an HF directory (config.json + model.safetensors[.index.json]) "
        "or a DeepSpeed step checkpoint (<run>/checkpoints/step_N with *model_states.pt, or "
        "<run>/checkpoints with a `latest` file)"
    )


def step_of(step_dir: Path) -> int | None:
    m = re.fullmatch(r"step_(\d+)", step_dir.name)
    return int(m.group(1)) if m else None


def run_dir_of(step_dir: Path) -> Path:
    """`<run>` of `<run>/checkpoints/step_N`."""
    return step_dir.parent.parent


def run_model_source(step_dir: Path, fallback: Any = None) -> tuple[Any, str]:
    """(ModelConfig the run trained, where its weights started): from `<run>/config.yaml`.

    The returned ModelConfig's `path` is the run's `init_checkpoint` when it had one (itself an HF dir
    or a step checkpoint), so its architecture is that checkpoint's. `fallback` (a ModelConfig) is
    used when the run has no config.yaml (an SFT run).
    """
    from omegaconf import OmegaConf

    cfg_file = run_dir_of(step_dir) / "config.yaml"
    if not cfg_file.is_file():
        if fallback is None:
            raise CheckpointPathError(f"{step_dir}: no {cfg_file} to read the model architecture from")
        return fallback, f"model config given to the export ({cfg_file} absent)"
    raw = OmegaConf.to_container(OmegaConf.load(cfg_file), resolve=False)
    assert isinstance(raw, dict)
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    model = ModelConfig(**{k: v for k, v in (raw.get("model") or {}).items() if k in fields})
    if raw.get("init_checkpoint"):
        model = dataclasses.replace(model, path=str(raw["init_checkpoint"]))
    return model, str(cfg_file)


def hf_config_for(model_cfg: Any, _depth: int = 0):
    """The HYV3Config of a ModelConfig whose path may be an HF dir, a step checkpoint, or empty (preset)."""
    from transformers import AutoConfig

    from hymem_train.models.presets import make_config

    if not model_cfg.path:
        return make_config(model_cfg.preset, attn_implementation=model_cfg.attn_implementation)
    kind = checkpoint_kind(model_cfg.path)
    if kind == "hf":
        cfg = AutoConfig.from_pretrained(model_cfg.path, local_files_only=True)
        cfg._attn_implementation = model_cfg.attn_implementation
        return cfg
    if _depth > 8:
        raise CheckpointPathError(f"{model_cfg.path}: init_checkpoint chain longer than 8 runs")
    parent, _ = run_model_source(step_dir_of(model_cfg.path), fallback=None)

    return hf_config_for(
        dataclasses.replace(parent, attn_implementation=model_cfg.attn_implementation), _depth + 1
    )


def _strip(name: str) -> str:
    if not name.startswith(_DS_PREFIX):
        raise CheckpointPathError(f"unexpected parameter name {name!r} in a DeepSpeed checkpoint")
    return name[len(_DS_PREFIX) :]


class DeepSpeedWeights:
    """The module weights of one step checkpoint, by HF name; `get(name)` assembles one tensor."""

    def __init__(self, step_dir: str | Path):
        import torch

        self.step_dir = Path(step_dir)
        optim = sorted(self.step_dir.glob("*_optim_states.pt"))
        if optim:  # ZeRO 1-3: fp32 master weights, consolidated by DeepSpeed per parameter
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            with contextlib.redirect_stdout(io.StringIO()):  # it prints progress bars and counts
                sd = get_fp32_state_dict_from_zero_checkpoint(
                    str(self.step_dir.parent), tag=self.step_dir.name, lazy_mode=True
                )
            self.source = f"DeepSpeed ZeRO partitions ({len(optim)} rank file(s), fp32 master weights)"
        else:  # ZeRO 0: the module's own state dict, memory-mapped
            f = self.step_dir / "mp_rank_00_model_states.pt"
            if not f.is_file():
                raise CheckpointPathError(f"{self.step_dir}: no *_optim_states.pt and no {f.name}")
            sd = torch.load(f, map_location="cpu", mmap=True, weights_only=False)["module"]
            self.source = "DeepSpeed module state (ZeRO-0)"
        self._sd = {_strip(k): v for k, v in sd.items()}

    def names(self) -> list[str]:
        return list(self._sd)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._sd[name].shape)

    def get(self, name: str):
        """One full tensor (a new CPU tensor for ZeRO partitions, a mapped view for ZeRO-0)."""
        return self._sd[name].contiguous()  # GatheredTensor.contiguous() assembles the N slices

    def iter_tensors(self, order: list[str]) -> Iterator[tuple[str, Any]]:
        for name in order:
            yield name, self.get(name)
