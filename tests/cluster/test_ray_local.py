"""A local stage run starts its own Ray cluster whatever `ray start` left behind: a stale
`ray_current_cluster` address file (here under RAY_TMPDIR) must not make `ray.init` join or fail."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts a Ray cluster (~10 s)

CODE = """
import ray
from hymem_train.cluster import init_ray
from hymem_train.config import ClusterConfig
init_ray(ClusterConfig(ray_address="local", num_cpus=1))
print("CPU", ray.cluster_resources().get("CPU"))
ray.shutdown()
"""


def test_local_start_ignores_a_stale_address_file():
    # a short directory: Ray's socket paths under it must stay within the 107-byte limit
    tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    try:
        (tmp / "ray").mkdir()
        (tmp / "ray" / "ray_current_cluster").write_text("127.0.0.1:6390")  # nothing listens there
        env = {**os.environ, "RAY_TMPDIR": str(tmp)}
        env.pop("RAY_ADDRESS", None)
        r = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "CPU 1.0" in r.stdout
    finally:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
