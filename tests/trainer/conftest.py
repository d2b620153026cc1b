from __future__ import annotations

import pytest
import torch


@pytest.fixture
def tiny_model():
    from hymem_train.models.presets import build_model, make_config

    torch.set_num_threads(1)
    cfg = make_config("tiny", attn_implementation="eager")
    return build_model(cfg, seed=0)
