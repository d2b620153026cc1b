"""Routing capture/replay (foundation issue item 4, the report's MoE routing replay)."""

import numpy as np
import pytest
import torch

from hymem_train.models import NOT_ROUTED, RoutingController, RoutingMismatchError, build_model


@pytest.fixture()
def model():
    torch.manual_seed(0)
    m = build_model("tiny", seed=0)
    m.eval()
    return m


def _ids(b=2, s=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 800, (b, s), generator=g)


def _capture(model, ids):
    ctl = RoutingController.attach(model)
    with torch.no_grad(), ctl.capture() as rec:
        logits = model(ids).logits
    return ctl, rec.routes_TLK, logits


def test_a_replay_of_recorded_routes_reproduces_logits_exactly(model):
    ids = _ids()
    ctl, routes, logits = _capture(model, ids)
    assert routes.shape == (ids.numel(), 2, 2)
    with torch.no_grad(), ctl.replay(routes):
        again = model(ids).logits
    assert torch.equal(logits, again)
    assert ctl.stats()["moe/replay_mismatch_rate"] == 0.0
    # [B, S, L, K] layout is accepted too
    with torch.no_grad(), ctl.replay(routes.reshape(2, 9, 2, 2)):
        assert torch.equal(model(ids).logits, logits)


def test_b_other_routes_change_output_and_router_still_gets_gradient(model):
    ids = _ids()
    ctl, routes, logits = _capture(model, ids)
    other = (routes.astype(np.int64) + 3) % 8  # a different, still valid, top-2 per token
    other[..., 1] = np.where(other[..., 1] == other[..., 0], (other[..., 0] + 1) % 8, other[..., 1])
    model.zero_grad()
    with ctl.replay(other):
        out = model(ids).logits
        out.square().mean().backward()
    assert not torch.allclose(out.detach(), logits)
    assert ctl.stats()["moe/replay_mismatch_rate"] > 0.5
    gates = [m for m in model.modules() if type(m).__name__ == "HYV3TopKRouter"]
    for g in gates:
        assert g.weight.grad is not None and g.weight.grad.abs().sum() > 0


def test_c_mismatched_routes_raise_clear_errors(model):
    ids = _ids()
    ctl, routes, _ = _capture(model, ids)
    with pytest.raises(RoutingMismatchError, match="layers"), ctl.replay(routes[:, :1]):
        pass
    with pytest.raises(RoutingMismatchError, match="top-"), ctl.replay(routes[:, :, :1]):
        pass
    with (
        pytest.raises(RoutingMismatchError, match="token alignment"),
        torch.no_grad(),
        ctl.replay(routes[:-1]),
    ):
        model(ids)
    bad = routes.copy()
    bad[0, 0, 0] = 99
    with pytest.raises(RoutingMismatchError, match="outside"), ctl.replay(bad):
        pass
    with pytest.raises(RoutingMismatchError, match=r"\[N, L, K\]"), ctl.replay(routes[:, 0]):
        pass
    # the controller is usable again after each error
    with torch.no_grad(), ctl.replay(routes):
        model(ids)


def test_d_sentinel_rows_route_freely(model):
    ids = _ids()
    ctl, routes, logits = _capture(model, ids)
    forced = (routes.astype(np.int64) + 1) % 8
    forced[:, :, 1] = (forced[:, :, 0] + 1) % 8
    forced = forced.reshape(2, 9, 2, 2)
    forced[:, -1] = NOT_ROUTED  # e.g. the last sampled token of each segment: the engine never routed it
    with torch.no_grad(), ctl.replay(forced):
        out = model(ids).logits
    assert ctl.stats()["moe/replayed_slots"] == 2 * 8 * 2  # 16 replayed tokens x 2 layers
    # free rows get the free routes: replaying the recorded routes with sentinels everywhere is a free forward
    all_free = np.full_like(routes, NOT_ROUTED)
    with torch.no_grad(), ctl.replay(all_free):
        assert torch.equal(model(ids).logits, logits)
    assert ctl.stats()["moe/replayed_slots"] == 0
    assert not torch.allclose(out, logits)


def test_replay_is_stable_under_activation_checkpointing():
    ids = _ids(1, 12, seed=2)
    ref = build_model("tiny", seed=5)
    ckpt = build_model("tiny", seed=5)
    ckpt.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    ref.train(), ckpt.train()
    ctl_ref, routes, _ = _capture(ref, ids)
    ref.train()
    other = (routes.astype(np.int64) + 2) % 8
    other[..., 1] = (other[..., 0] + 5) % 8
    grads = []
    for m in (ref, ckpt):
        ctl = RoutingController.attach(m)
        m.zero_grad()
        with ctl.replay(other):
            m(ids).logits.float().logsumexp(-1).mean().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-5, atol=1e-6)


def test_capture_across_decode_steps_concatenates_calls(model):
    ctl = RoutingController.attach(model)
    ids = _ids(1, 5)
    with torch.no_grad(), ctl.capture() as rec:
        out = model(ids, use_cache=True)
        model(ids[:, -1:], cache=out.cache, use_cache=True)
    assert [c.shape[0] for c in rec.calls] == [5, 1]
    assert rec.routes_TLK.shape == (6, 2, 2)


def test_attach_is_idempotent_and_detach_restores_free_routing(model):
    a = RoutingController.attach(model)
    assert RoutingController.attach(model) is a
    a.detach()
    b = RoutingController.attach(model)
    assert b is not a and len(b._handles) == 2
