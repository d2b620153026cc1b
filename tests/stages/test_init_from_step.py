"""The report's RL start: `python -m hymem_train.rl ... init_checkpoint=<opd>/checkpoints/step_N` (a DeepSpeed
ZeRO-3 step checkpoint, not an HF directory), at tiny scale through the real CLIs."""

import pytest
import torch

from hymem_train.models.config import ModelConfig

pytestmark = pytest.mark.slow


def test_rl_starts_from_an_opd_step_checkpoint(assets, stage, opd_one_rank):
    from safetensors.torch import load_file

    from hymem_train.models.loading import load_model

    root = assets["root"]
    opd = opd_one_rank  # OPD, 2 steps, a step checkpoint each (the shared reference run, read only)
    step2 = opd / "checkpoints" / "step_2"
    assert (opd / "checkpoints" / "latest").read_text().strip() == "step_2"
    # the step checkpoint loads as exactly the weights OPD ended with (its `final` export, fp32)
    final = load_file(opd / "final" / "model.safetensors")
    loaded = load_model(ModelConfig(path=str(step2))).state_dict()
    experts = loaded["model.layers.0.mlp.experts.gate_up_proj"]
    inter = experts.shape[1] // 2
    assert torch.equal(final["model.layers.0.mlp.experts.1.up_proj.weight"], experts[1, inter:])
    assert torch.equal(final["model.embed_tokens.weight"], loaded["model.embed_tokens.weight"])
    assert torch.equal(
        final["model.layers.2.mlp.expert_bias"], loaded["model.layers.2.mlp.e_score_correction_bias"]
    )

    rl = root / "rl_from_step"
    stage.run(
        stage.cmd("rl", assets, rl, "num_steps=1", "save_every=1", f"init_checkpoint={step2}"),
        root / "rl_from_step.log",
    )
    m = stage.metrics(rl)
    assert "train/loss" in m[1] and m[1]["rollout/segments"] > 0
    assert f"init_checkpoint: {step2}" in (rl / "config.yaml").read_text()
    assert (rl / "final" / "model.safetensors").exists()
