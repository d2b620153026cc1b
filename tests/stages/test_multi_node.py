"""A stage on a simulated two-node Ray cluster (two raylets on this machine; the second at 127.0.0.2,
with a `rollout` resource) reproduces the one-node run.

The driver (trainer rank 0, gateway, teacher) joins the cluster on the head node; the policy engine is
two HF replicas as Ray actors, one per node (STRICT_SPREAD), fed by the weight sync over the gloo
weight-update group; the rollout workers run only on the second node (rollout.ray_resources), so every
LLM call crosses from there to the gateway on the driver's address (gateway.host=auto)."""

import json

import pytest

from tests.stages.conftest import OPD_TWO_STEPS, RL_TWO_STEPS

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


@pytest.fixture
def two_nodes(monkeypatch):
    """The cluster, its node table; the stage's environment as the 1-rank reference runs had it."""
    import ray

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    c.add_node(num_cpus=2, resources={"rollout": 2}, node_ip_address="127.0.0.2")
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)  # to read the node table; the stage joins on its own
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    ray.shutdown()
    yield c, nodes
    c.shutdown()


def test_two_node_opd_reproduces_one_node(assets, stage, opd_one_rank, two_nodes):
    cluster, nodes = two_nodes
    out = assets["root"] / "opd_2node"
    extra = (
        f"cluster.ray_address={cluster.address}",
        "cluster.placement.policy_replicas=2",
        "cluster.placement.replica_strategy=STRICT_SPREAD",
        "++rollout.ray_resources={rollout: 1}",
        "gateway.host=auto",
    )
    stage.run(stage.cmd("opd", assets, out, *OPD_TWO_STEPS, *extra), assets["root"] / "opd_2node.log")
    where = json.loads((out / "placement.json").read_text())
    worker = next(n for n, ip in nodes.items() if ip == "127.0.0.2")
    head = next(n for n in nodes if n != worker)
    assert where["driver"]["node_id"] == head
    assert sorted(r["node_id"] for r in where["policy"]) == sorted(nodes)  # one replica on each node
    assert {w["node_id"] for w in where["rollout_workers"]} == {worker}  # away from the gateway's node
    assert where["gateway"].startswith(f"http://{nodes[head]}:")  # a routable address, not loopback-only
    stage.same_run(opd_one_rank, out, stage.OPD_KEYS)
    m = stage.metrics(out)
    assert m[1]["perf/weight_sync_seconds"] > 0 and m[1]["train/grad_norm"] > 0


def test_two_node_rl_serves_its_reader_from_replicas_on_both_nodes(
    assets, stage, opd_one_rank, rl_one_rank, two_nodes
):
    """RL's frozen reader as the stage's own pool (cluster.placement.reader.replicas): one HF replica per
    node behind a reader gateway on the driver's routable address, reward actors calling it. The 1-node
    reference served its reader in the driver process; the greedy reader gives the same rewards."""
    cluster, nodes = two_nodes
    out = assets["root"] / "rl_2node_reader"
    extra = (
        f"cluster.ray_address={cluster.address}",
        "cluster.placement.reader.replicas=2",
        "cluster.placement.replica_strategy=STRICT_SPREAD",
        "cluster.placement.cpus_per_replica=0.5",
        "gateway.host=auto",
        f"init_checkpoint={opd_one_rank}/final",
    )
    stage.run(stage.cmd("rl", assets, out, *RL_TWO_STEPS, *extra), assets["root"] / "rl_2node_reader.log")
    where = json.loads((out / "placement.json").read_text())
    head = where["driver"]["node_id"]
    assert sorted(r["node_id"] for r in where["reader"]) == sorted(nodes)  # one reader replica per node
    assert where["reader_gateway"].startswith(f"http://{nodes[head]}:")  # routable, not loopback-only
    m = stage.metrics(out)
    assert m[1]["reward/reader_calls"] > 0
    stage.same_run(rl_one_rank, out, stage.RL_KEYS)
