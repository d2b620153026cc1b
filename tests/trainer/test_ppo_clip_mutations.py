"""Each side of the PPO clip binds where it should (removing the lower clip once passed
`test_ppo_golden`, which has no token with ratio < 1 - clip_low and a negative advantage).

Four tokens, one per (ratio side, advantage sign), clip 0.2/0.2:
  r = 0.5, A = -1: lower clip binds: loss = -min(-0.5, -0.8) = 0.8, clipped, no gradient
  r = 0.5, A = +1: unclipped: loss = -0.5, gradient -r A = -0.5
  r = 1.5, A = +1: upper clip binds: loss = -1.2, clipped, no gradient
  r = 1.5, A = -1: unclipped: loss = 1.5, gradient -r A = 1.5
"""

import math

import pytest
import torch

from hymem_train.trainer.losses import ppo_token_loss

RATIO = [0.5, 0.5, 1.5, 1.5]
ADV = [-1.0, 1.0, 1.0, -1.0]


def _loss():
    logp = torch.tensor([math.log(r) for r in RATIO], dtype=torch.float64, requires_grad=True)
    loss, clipped = ppo_token_loss(
        logp,
        torch.zeros(4, dtype=torch.float64),
        torch.tensor(ADV, dtype=torch.float64),
        clip_low=0.2,
        clip_high=0.2,
    )
    loss.sum().backward()
    return loss.detach().tolist(), clipped.tolist(), logp.grad.tolist()


def test_lower_clip_binds_for_negative_advantage():
    loss, clipped, grad = _loss()
    assert loss[0] == pytest.approx(0.8) and clipped[0] is True and grad[0] == 0.0
    assert loss[1] == pytest.approx(-0.5) and clipped[1] is False and grad[1] == pytest.approx(-0.5)


def test_upper_clip_binds_for_positive_advantage():
    loss, clipped, grad = _loss()
    assert loss[2] == pytest.approx(-1.2) and clipped[2] is True and grad[2] == 0.0
    assert loss[3] == pytest.approx(1.5) and clipped[3] is False and grad[3] == pytest.approx(1.5)
