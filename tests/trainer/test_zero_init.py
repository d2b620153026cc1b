"""Low-memory loading for ZeRO-3 (`trainer.zero_init`, trainer/engine.py load_trainer_model): on 2 ranks
a checkpoint is built inside deepspeed.zero.Init, so no rank holds a full copy, and training from it is
the same as training from a whole copy on every rank (torchrun, CPU/gloo)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hymem_train.models.config import ModelConfig
from tests.trainer.test_engine_dist import _assert_same, run_worker

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _loads(out) -> list[dict]:
    return [json.loads(open(f"{out}.load{r}.json").read()) for r in range(2)]


def test_zero_init_partitions_at_load_trains_the_same_and_reads_step_checkpoints_on_rank_0(tmp_path):
    from hymem_train.models.presets import build_model, make_config

    hf = tmp_path / "hf"
    # several safetensors shards, as a 30B checkpoint has
    build_model(make_config("tiny", attn_implementation="eager"), seed=0).save_pretrained(
        hf, max_shard_size="200KB"
    )
    assert len(list(hf.glob("*.safetensors"))) > 3

    run = tmp_path / "run"  # a stage run's layout: its config.yaml names the architecture's source
    run.mkdir()
    (run / "config.yaml").write_text(f"init_checkpoint: {hf}\nmodel:\n  preset: tiny\n")
    m_zi, p_zi = run_worker(
        2, tmp_path / "zi", "--init-from", str(hf), "--save-dir", str(run / "checkpoints")
    )
    m_whole, p_whole = run_worker(2, tmp_path / "whole", "--init-from", str(hf), "--no-zero-init")

    # before DeepSpeed: under zero_init every parameter is already a partition (no rank built it whole),
    # each rank holding about half; without it every rank held the whole model
    zi, whole = _loads(tmp_path / "zi"), _loads(tmp_path / "whole")
    for r in range(2):
        assert len(zi[r]["partitioned"]) == zi[r]["num_params"] > 0
        assert zi[r]["local_numel"] <= math.ceil(zi[r]["full_numel"] / 2) + zi[r]["num_params"]
        assert whole[r]["partitioned"] == [] and whole[r]["local_numel"] == whole[r]["full_numel"]
    assert zi[0]["full_numel"] == whole[0]["full_numel"]

    # the same step from either load
    assert m_zi[0]["train/loss"] == m_whole[0]["train/loss"]
    assert m_zi[0]["train/grad_norm"] == pytest.approx(m_whole[0]["train/grad_norm"], rel=1e-6)
    _assert_same(p_zi, p_whole)
    assert max((p_zi[k] - p_whole[k]).abs().max().item() for k in p_zi) == 0.0

    # a DeepSpeed step checkpoint (the report's RL init): rank 0 reads every parameter, rank 1 none,
    # and the model holds exactly the weights the run saved
    [step] = list((run / "checkpoints").glob("step_*"))
    _, p_step = run_worker(2, tmp_path / "step", "--init-from", str(step), "--steps", "0")
    st = _loads(tmp_path / "step")
    assert len(st[0]["param_reads"]) == st[0]["num_params"] and st[1]["param_reads"] == []
    assert len(st[1]["partitioned"]) == st[1]["num_params"]
    for k in p_zi:
        assert torch.equal(p_step[k], p_zi[k]), k


def test_missing_weight_in_an_hf_checkpoint_is_refused(tmp_path):
    """transformers only warns about a missing weight and leaves it at random init: load_model refuses."""
    from safetensors.torch import load_file, save_file

    from hymem_train.models.loading import load_model
    from hymem_train.models.presets import build_model, make_config

    hf = tmp_path / "hf"
    build_model(make_config("tiny"), seed=0).save_pretrained(hf)
    sd = load_file(hf / "model.safetensors")
    name = next(k for k in sd if k.endswith("post_attention_layernorm.weight"))
    del sd[name]
    save_file(sd, hf / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="the checkpoint lacks .*post_attention_layernorm"):
        load_model(ModelConfig(path=str(hf)))
