"""Model/tokenizer loading from config: one function per source (`load_preset`, `load_hf_dir`,
`load_step_checkpoint`), chosen by `load_model`.

`path` may be an HF directory or a DeepSpeed step checkpoint written by `Trainer.save`
(`<run>/checkpoints/step_N`): the report's RL starts from OPD step 375. A step checkpoint's
architecture comes from its run's config.yaml and its weights from DeepSpeed's per-parameter
consolidation of the ZeRO partitions (models/checkpoint_files.py).

No hub: `from_pretrained` always runs with local_files_only=True.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hymem_train.models.checkpoint_files import DeepSpeedWeights, checkpoint_kind, hf_config_for, step_dir_of
from hymem_train.models.config import ModelConfig
from hymem_train.models.presets import build_model, make_config
from hymem_train.models.tokenizer import ASSET_DIR, load_tokenizer

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
    """The model `cfg` names, from one of three sources: a preset built from config (`path` empty), an
    HF directory, or a DeepSpeed step checkpoint (`<run>/checkpoints/step_N`). Anything else at `path`
    is a CheckpointPathError naming what was looked for."""
    require_local_dir(cfg.path, "model.path")
    cfg.validate()
    if not cfg.path:
        return load_preset(cfg)
    if checkpoint_kind(cfg.path) == "deepspeed":
        return load_step_checkpoint(cfg)
    return load_hf_dir(cfg)


def load_preset(cfg: ModelConfig):
    """A fresh model of `cfg.preset`, initialised from `cfg.seed` (the same seed, the same weights)."""
    return build_model(
        make_config(cfg.preset, attn_implementation=cfg.attn_implementation), cfg.seed, DTYPES[cfg.dtype]
    )


def load_hf_dir(cfg: ModelConfig):
    """The HF directory at `cfg.path`, refusing one whose weights do not cover the model."""
    from transformers import HYV3ForCausalLM

    model, info = HYV3ForCausalLM.from_pretrained(
        cfg.path,
        local_files_only=True,
        dtype=DTYPES[cfg.dtype],
        attn_implementation=cfg.attn_implementation,
        output_loading_info=True,
    )
    # transformers only warns and leaves such a weight at its random init (under ZeRO-3 too)
    if info["missing_keys"] or info["mismatched_keys"]:
        raise ValueError(
            f"model.path={cfg.path}: the checkpoint lacks {sorted(info['missing_keys'])[:5]} and has "
            f"other shapes for {sorted(info['mismatched_keys'])[:5]}; they would train from random init"
        )
    return model


def load_tokenizer_for(cfg: ModelConfig):
    key = "model.tokenizer_path" if cfg.tokenizer_path else "model.path" if cfg.path else ""
    return load_tokenizer(cfg.tokenizer_path or cfg.path or ASSET_DIR, key=key)


def load_step_checkpoint(cfg: ModelConfig):
    """An HYV3ForCausalLM with the module weights of a DeepSpeed step checkpoint (`cfg.path`).

    Under ZeRO-3 (`trainer/engine.py load_trainer_model` holds transformers' DeepSpeed config), the
    model is built partitioned and rank 0 reads and scatters one consolidated parameter at a time."""
    from transformers import HYV3ForCausalLM
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    hf_config = hf_config_for(cfg)
    zero3 = is_deepspeed_zero3_enabled()
    if zero3:  # _from_config builds inside deepspeed.zero.Init when zero3 is on
        model = HYV3ForCausalLM._from_config(hf_config, dtype=DTYPES[cfg.dtype])
    else:
        model = build_model(hf_config, cfg.seed, DTYPES[cfg.dtype])
    weights = DeepSpeedWeights(step_dir_of(cfg.path))
    expected = dict(model.state_dict())
    missing = sorted(set(expected) - set(weights.names()))
    unexpected = sorted(set(weights.names()) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{cfg.path}: checkpoint and model config disagree: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, target in expected.items():  # one consolidated parameter at a time
            p = params.get(name)
            if not zero3 or p is None:  # buffers are not partitioned: every rank sets its own
                _copy_checked(cfg.path, name, weights.get(name), target)
                continue
            import deepspeed

            with deepspeed.zero.GatheredParameters([p], modifier_rank=0):
                if torch.distributed.get_rank() == 0:
                    _copy_checked(cfg.path, name, weights.get(name), p.data)
    return model


def _copy_checked(path: str, name: str, src: torch.Tensor, target: torch.Tensor) -> None:
    if tuple(src.shape) != tuple(target.shape):
        raise ValueError(f"{path}: {name} has shape {tuple(src.shape)}, the model {tuple(target.shape)}")
    target.copy_(src)
