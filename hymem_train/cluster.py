"""Ray start-up for a stage: a fresh local cluster, or the one `slurm/` started, and a capacity check
that fails fast where actors would otherwise wait forever."""

from __future__ import annotations

import logging

from hymem_train.config import ClusterConfig
from hymem_train.run_config import StageConfig, ray_cpu_demand

log = logging.getLogger(__name__)


def init_ray(cluster: ClusterConfig) -> None:
    import ray

    if ray.is_initialized():
        return
    if cluster.ray_address == "local":
        # address="local" always starts a new cluster: without it ray.init joins whatever cluster a
        # `ray_current_cluster` file left in the Ray temp dir names, and a stale one fails every run
        ray.init(
            address="local",
            num_cpus=cluster.num_cpus,
            include_dashboard=cluster.dashboard,
            log_to_driver=cluster.log_to_driver,
        )
    else:
        ray.init(address=cluster.ray_address, log_to_driver=cluster.log_to_driver)
    if not cluster.log_to_driver:
        session = ray.get_runtime_context().gcs_address
        log.info(
            "Ray actors' logs (cluster.log_to_driver=false): %s/logs on each node (session of GCS %s)",
            _session_dir(),
            session,
        )


def _session_dir() -> str:
    """This Ray session's directory on the driver's node (worker logs are under <it>/logs)."""
    try:
        from ray._private.worker import _global_node

        return _global_node.get_session_dir_path()
    except Exception:  # a private API: the path is a convenience, not a contract
        return "<ray temp dir>/session_latest"


def check_ray_capacity(cfg: StageConfig) -> None:
    """A local Ray start with fewer CPUs than the actors reserve does not fail: the extra actors stay
    pending and the first step waits forever. Say so up front. On a joined cluster the autoscaler
    may still add nodes, so only warn there."""
    import ray

    have = float(ray.cluster_resources().get("CPU", 0.0))
    need = ray_cpu_demand(cfg)
    if need <= have + 1e-9:
        return
    msg = (
        f"Ray actors reserve {need:g} CPUs (rollout.num_workers={cfg.rollout.num_workers} x "
        f"rollout.num_cpus_per_worker={cfg.rollout.num_cpus_per_worker}"
        + " + engine replicas x cluster.placement.cpus_per_replica"
        + (" + reward actors" if getattr(cfg, "reward", None) is not None else "")
        + f") but the Ray cluster has {have:g}: the actors that do not fit would wait forever. Lower "
        "rollout.num_workers or rollout.num_cpus_per_worker, or raise cluster.num_cpus"
    )
    if cfg.cluster.ray_address == "local":
        raise ValueError(msg)
    log.warning(msg)
