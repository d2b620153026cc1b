"""Engine replicas as Ray actors on a simulated two-node Ray cluster (two raylets on one machine, the
second at 127.0.0.2): each replica lands on its own node, the pool answers exactly as one in-process
engine does, and a weight sync over the gloo weight-update group reaches both replicas."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hymem_train.engines.base import SamplingParams
from hymem_train.engines.config import EngineConfig
from hymem_train.engines.factory import build_engine
from hymem_train.models.config import ModelConfig
from hymem_train.trainer.weight_sync import WeightSyncConfig, sync_weights

pytestmark = pytest.mark.slow  # a two-node Ray cluster and two engine processes (~1 min)


@pytest.fixture(scope="module")
def two_nodes():
    import ray
    from ray.cluster_utils import Cluster

    # head and worker: 1 CPU each, so a 1-CPU replica per node is all that fits
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1, node_ip_address="127.0.0.2")
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def _outputs_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.response_ids == y.response_ids and x.finish_reason == y.finish_reason
        # another batch composition (other padding) moves a logprob by fp32 rounding, never a token
        np.testing.assert_allclose(np.asarray(x.logprobs), np.asarray(y.logprobs), rtol=0, atol=1e-5)
        np.testing.assert_array_equal(x.routed_experts_TLE, y.routed_experts_TLE)


def test_two_replicas_on_two_nodes_match_one_engine_and_take_a_sync(two_nodes, tmp_path):
    import ray

    from hymem_train.engines.replicas import ReplicaPool
    from hymem_train.models.presets import build_model, make_config
    from hymem_train.models.tokenizer import default_tokenizer

    tok = default_tokenizer()
    build_model(make_config("tiny"), seed=0).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    ecfg, mcfg = (
        EngineConfig(kind="hf", max_model_len=256, max_batch_size=4),
        ModelConfig(path=str(tmp_path / "m")),
    )
    local = build_engine(ecfg, mcfg, tok)
    pool = ReplicaPool(ecfg, mcfg, tok, num_replicas=2, strategy="STRICT_SPREAD")
    try:
        nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        assert len(set(pool.node_ids())) == 2 and set(pool.node_ids()) == set(nodes)
        assert "127.0.0.2" in {i["node_ip"] for i in pool.infos}
        rng = np.random.default_rng(0)
        prompts = [list(rng.integers(5, 800, size=int(n))) for n in (7, 12, 3, 9, 15)]
        params = [SamplingParams(max_tokens=6, temperature=1.0, seed=100 + i) for i in range(5)]
        before = pool.generate(prompts, params)
        _outputs_equal(before, local.generate(prompts, params))
        # one request at a time as it arrives, round robin (the gateway's path for vLLM's async engine)
        futures = [pool.submit(p, sp) for p, sp in zip(prompts, params, strict=True)]
        _outputs_equal([f.result(timeout=120) for f in futures], before)
        assert not pool.continuous_batching  # HF replicas: the gateway keeps its static batcher
        for a, b in zip(pool.topk_logprobs(prompts[:3], 4), local.topk_logprobs(prompts[:3], 4), strict=True):
            assert torch.equal(a.ids_TK, b.ids_TK)
            torch.testing.assert_close(a.logprobs_TK, b.logprobs_TK, rtol=0, atol=1e-5)
        # a sync: other weights (seed 3) into both replicas over the weight group, and into the local engine
        trained = build_model(make_config("tiny"), seed=3)
        m = sync_weights(trained, [pool, local], version=5, cfg=WeightSyncConfig(bucket_mb=0.2))
        assert m["perf/weight_sync_buckets"] >= 2 and pool.policy_version == local.policy_version == 5
        assert [i["policy_version"] for i in ray.get([r.info.remote() for r in pool.replicas])] == [5, 5]
        after = pool.generate(prompts, params)
        _outputs_equal(after, local.generate(prompts, params))
        assert any(
            x.response_ids != y.response_ids for x, y in zip(after, before, strict=True)
        )  # new weights
    finally:
        pool.shutdown()
