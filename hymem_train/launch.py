"""What slurm/ray_job.sbatch asks before and while it starts a stage on an allocation.

    python -m hymem_train.launch check hymem_train.opd NNODES GPUS_PER_NODE [overrides...]
    python -m hymem_train.launch wait ADDRESS NODE=IP [NODE=IP ...] [--timeout S]

`check` composes and validates the stage's config for this allocation before anything starts (a bad
override fails here, in seconds, with the config error), and prints shell assignments the job script
evaluates: the run directory, which nodes run trainer ranks and how many per node, and how many GPUs
the Ray node on a training node offers. On GPUs it also runs the preflight (`hymem_train.plan`), so a
placement the allocation cannot hold is refused before Ray starts. Exit 2 on a refusal.

`wait` polls the Ray cluster at ADDRESS until a live node holds every IP, or fails naming the nodes
that did not join.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hymem_train.config import ConfigError, compose, to_typed
from hymem_train.plan import make_plan
from hymem_train.preemption import MARKER, REQUEST
from hymem_train.run_config import OpdConfig, RlConfig, StageConfig

ENTRIES = {"hymem_train.opd": ("opd", OpdConfig), "hymem_train.rl": ("rl", RlConfig)}


@dataclass(frozen=True)
class Layout:
    run_dir: Path
    train_nodes: int  # trainer ranks run on the allocation's first `train_nodes` nodes
    procs_per_node: int  # torchrun --nproc-per-node on each of them
    ray_gpus_on_train_nodes: int  # split: 0, so no engine replica lands on a training GPU

    def shell(self) -> str:
        rows = {
            "RUN_DIR": str(self.run_dir),
            "TRAIN_NODES": self.train_nodes,
            "PROCS_PER_NODE": self.procs_per_node,
            "RAY_GPUS_ON_TRAIN_NODES": self.ray_gpus_on_train_nodes,
            "PREEMPT_REQUEST": str(self.run_dir / REQUEST),
            "PREEMPTED_MARKER": str(self.run_dir / MARKER),
        }
        return "".join(f"{k}={shlex.quote(str(v))}\n" for k, v in rows.items())


def stage_config(entry: str, overrides: list[str]) -> StageConfig:
    if entry not in ENTRIES:
        raise ConfigError(f"entry point {entry!r}: slurm/ray_job.sbatch runs {' or '.join(ENTRIES)}")
    name, schema = ENTRIES[entry]
    # Hydra's own settings (hydra.run.dir, ...) are the entry point's business, not the schema's
    kept = [o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    try:
        return to_typed(compose(name, kept), schema)
    except ConfigError:
        raise
    except Exception as e:  # Hydra's override grammar and missing config groups
        raise ConfigError(f"{type(e).__name__}: {e}") from None


def layout(cfg: StageConfig) -> Layout:
    """Trainer ranks and Ray GPUs for cfg.cluster, which the job script set from the allocation."""
    cl = cfg.cluster
    run_dir = Path(cfg.run.output_dir).resolve()
    if cl.num_gpus_per_node == 0:  # CPU nodes: one trainer rank on each
        return Layout(run_dir, cl.num_nodes, 1, 0)

    plan = make_plan(cfg)  # PlanError (a ValueError) names what does not fit
    train = plan.pools[0]  # the trainer's pool always comes first, from GPU 0
    gpn = cl.num_gpus_per_node
    if train.num_gpus > gpn and train.num_gpus % gpn:
        raise ConfigError(
            f"{train.num_gpus} trainer GPUs over nodes of {gpn}: torchrun starts the same number of ranks "
            "on every node, so cluster.placement.train_gpus must be a multiple of the GPUs per node"
        )
    colocated = train.role != "train"
    return Layout(run_dir, math.ceil(train.num_gpus / gpn), min(train.num_gpus, gpn), gpn if colocated else 0)


def check(entry: str, num_nodes: int, gpus_per_node: int, overrides: list[str]) -> Layout:
    # the allocation is the truth: it overrides whatever cluster file the overrides picked, and the
    # job script passes the Ray head it starts and the gateway's routable address the same way
    alloc = [f"cluster.num_nodes={num_nodes}", f"cluster.num_gpus_per_node={gpus_per_node}"]
    job = [*alloc, "cluster.ray_address=auto", "gateway.host=auto"]
    return layout(stage_config(entry, [*overrides, *job]))


def wait_for_nodes(address: str, expected: dict[str, str], timeout: float) -> float:
    """Seconds until every expected node IP is a live Ray node; TimeoutError names the missing ones."""
    import ray

    t0 = time.monotonic()
    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    try:
        while True:
            alive = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
            missing = {name: ip for name, ip in expected.items() if ip not in alive}
            if not missing:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                names = ", ".join(f"{n} ({ip})" for n, ip in missing.items())
                raise TimeoutError(
                    f"{len(missing)} of {len(expected)} nodes did not join the Ray cluster at {address} "
                    f"within {timeout:g} s: {names}; see their ray-<node>.log next to this one"
                )
            time.sleep(0.5)
    finally:
        ray.shutdown()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m hymem_train.launch")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("entry")
    c.add_argument("num_nodes", type=int)
    c.add_argument("gpus_per_node", type=int)
    c.add_argument("overrides", nargs=argparse.REMAINDER)
    w = sub.add_parser("wait")
    w.add_argument("address")
    w.add_argument("nodes", nargs="+", help="NODE=IP")
    w.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args(argv)
    if a.cmd == "check":
        try:
            out = check(a.entry, a.num_nodes, a.gpus_per_node, a.overrides)
        except ValueError as e:  # ConfigError, PlanError, a schema's validate()
            print(f"config error: {e}", file=sys.stderr)
            return 2
        sys.stdout.write(out.shell())
        return 0
    expected = dict(n.split("=", 1) for n in a.nodes)
    try:
        took = wait_for_nodes(a.address, expected, a.timeout)
    except TimeoutError as e:
        print(f"ray: {e}", file=sys.stderr)
        return 1
    print(f"ray: all {len(expected)} nodes joined after {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
