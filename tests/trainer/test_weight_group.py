"""Weight sync over a process group (gloo): the wire format, the names a vLLM replica receives, and a
ZeRO-3 two-rank trainer syncing into two HF engine replicas in their own processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from hymem_train.trainer.weight_group import WeightBroadcaster, open_weight_group, receive_weights
from hymem_train.trainer.weight_sync import WeightSyncConfig, sync_weights
from tests.trainer.test_engine_dist import _free_port, run_worker
from tests.trainer.test_export import _export_plain, _tiny, vllm_expected_names

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """Stands in for an engine's loader: keeps what arrives, by name, per version."""

    def __init__(self, weight_names: str = "hf"):
        self.weight_names = weight_names
        self.got: dict[str, torch.Tensor] = {}
        self.versions: list = []

    def update_weights(self, named, version):
        named = list(named)
        assert not set(self.got) & {n for n, _ in named}, "a name arrived twice in one sync"
        self.got.update({n: t.clone() for n, t in named})
        self.versions.append(version)
        return len(named)

    def finish_sync(self, version):  # the vLLM engine's end of a sync (reload finalised, gate opened)
        self.versions.append(("finished", version))


def test_a_serving_replica_receives_what_a_saved_checkpoint_holds(tmp_path):
    """The names and values a vLLM-layout replica gets equal those of the exported checkpoint."""
    from safetensors.torch import load_file

    model = _tiny()
    model.model.layers[0].mlp.e_score_correction_bias.fill_(0.25)
    _export_plain(model, tmp_path / "out", dtype=torch.bfloat16)
    saved = {}
    for f in (tmp_path / "out").glob("*.safetensors"):
        saved.update(load_file(f))
    rx, hf = Recorder("serving"), Recorder("hf")
    sync_weights(model, [rx, hf], version=3, cfg=WeightSyncConfig(bucket_mb=0.05, dtype="bfloat16"))
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert set(rx.got) == set(saved) == vllm_expected_names(cfg)
    for n, t in saved.items():
        assert rx.got[n].dtype == t.dtype, n  # bf16, with the router and expert bias kept fp32
        torch.testing.assert_close(rx.got[n], t, rtol=0, atol=0, msg=n)
    # the training-name replica in the same sync keeps the fused names
    assert (
        "model.layers.0.mlp.experts.gate_up_proj" in hf.got
        and "model.layers.0.mlp.experts.0.up_proj.weight" in rx.got
    )


def test_broadcast_wire_format_roundtrip():
    """A sender and two receivers (threads, one gloo group): every tensor arrives bit-exact, in its dtype."""
    port = _free_port()
    named = [
        ("a", torch.randn(3, 4)),
        ("b", torch.randn(5).to(torch.bfloat16)),
        ("c", torch.arange(6, dtype=torch.int64).view(2, 3)),
        ("d", torch.randn(2, 2, 2)[:, 0]),  # a non-contiguous view
    ]
    got: dict[int, tuple[Recorder, dict]] = {}

    def replica(rank: int) -> None:
        rec = Recorder()
        stats = receive_weights(open_weight_group("127.0.0.1", port, rank, 3, timeout_s=60), rec)
        got[rank] = (rec, stats)

    threads = [threading.Thread(target=replica, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    tx = WeightBroadcaster(open_weight_group("127.0.0.1", port, 0, 3, timeout_s=60))
    tx.update_weights(named[:2], version=9)
    tx.update_weights(named[2:], version=9)
    tx.finish_sync(9)
    for t in threads:
        t.join(60)
    for rank in (1, 2):
        rec, stats = got[rank]
        # both buckets, then the sync's end: a vLLM replica never finalises its reload otherwise
        assert rec.versions == [9, 9, ("finished", 9)] and stats["buckets"] == 2 and stats["version"] == 9
        for n, t in named:
            assert rec.got[n].dtype == t.dtype and rec.got[n].shape == t.shape
            torch.testing.assert_close(rec.got[n], t, rtol=0, atol=0)
        assert stats["bytes"] == tx.bytes_sent


def test_group_refuses_a_bad_membership():
    with pytest.raises(ValueError, match="a sender and >= 1 replica"):
        open_weight_group("127.0.0.1", _free_port(), 0, 1)
    with pytest.raises(ValueError, match="want gloo"):
        open_weight_group("127.0.0.1", _free_port(), 0, 2, backend="mpi")


@pytest.mark.slow
@pytest.mark.distributed
def test_zero3_two_ranks_sync_into_two_replica_processes(tmp_path):
    """Trainer ranks 0 and 1 (ZeRO-3, torchrun) gather; rank 0 broadcasts to two HF engines in their own
    processes; both end up with the trained weights bit-exact."""
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    replicas = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests/trainer/weight_replica.py"),
                "--group",
                f"127.0.0.1:{port}",
                "--rank",
                str(r),
                "--world",
                "3",
                "--out",
                str(tmp_path / f"replica{r}"),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (1, 2)
    ]
    try:
        _, trained = run_worker(
            2, tmp_path / "train", "--steps", "1", "--weight-group", f"127.0.0.1:{port}:3"
        )
        outs = [p.communicate(timeout=300)[0] for p in replicas]
    finally:
        for p in replicas:
            p.kill()
    assert all(p.returncode == 0 for p in replicas), outs
    sync = json.loads((tmp_path / "train.sync.json").read_text())
    untrained = _tiny(seed=0)
    moved = max((trained[n] - p).abs().max().item() for n, p in untrained.named_parameters())
    assert moved > 1e-4  # the step changed the weights, so equality below is the sync's doing
    for r in (1, 2):
        state = torch.load(tmp_path / f"replica{r}.pt")
        stats = json.loads((tmp_path / f"replica{r}.json").read_text())
        assert stats["policy_version"] == 1 and stats["buckets"] == sync["perf/weight_sync_buckets"]
        for n, t in trained.items():
            torch.testing.assert_close(state[n], t, rtol=0, atol=0, msg=n)
