"""The policy as a Hugging Face checkpoint (config, safetensors, tokenizer): the end of every training
stage writes `<run>/final`, the next stage's `init_checkpoint`."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from hymem_train.models.config import ModelConfig
from hymem_train.models.loading import load_tokenizer_for
from hymem_train.trainer.engine import Trainer
from hymem_train.trainer.weight_sync import iter_full_param_buckets

log = logging.getLogger(__name__)


def persistent_buffers(model) -> dict:
    """The model's persistent buffers (HYV3's router `e_score_correction_bias`), which ZeRO-3 does not
    partition: without them the export loads with MISSING keys, silently re-initialised to zeros."""
    out = {}
    for mod_name, mod in model.named_modules():
        for name, buf in mod._buffers.items():
            if buf is not None and name not in mod._non_persistent_buffers_set:
                out[f"{mod_name}.{name}" if mod_name else name] = buf.detach().cpu().clone()
    return out


def export_hf(trainer: Trainer, model_cfg: ModelConfig, out: Path) -> None:
    """Collective (gathers ZeRO-3 shards); rank 0 writes `out` via a temp dir and a rename."""
    full = {n: t for bucket in iter_full_param_buckets(trainer.model, 256 << 20) for n, t in bucket}
    full.update(persistent_buffers(trainer.model))
    if trainer.rank == 0:
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        trainer.model.save_pretrained(tmp, state_dict=full)
        load_tokenizer_for(model_cfg).save_pretrained(tmp)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        log.info("exported %s", out)
