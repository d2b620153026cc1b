"""The preemption handshake without Slurm: a request (file or SIGUSR1) seen by the driver reaches every
rank through the trainer's broadcast; the forced checkpoint is written once; the marker tells the job
script to requeue. The Slurm end-to-end run is tests/stages/test_slurm.py."""

import json
import os
import signal

from hymem_train.checkpointing import StageCheckpoints
from hymem_train.preemption import MARKER, REQUEST, Preemption


class OneRank:
    def __init__(self):
        self.saved = []

    def broadcast(self, obj):
        return obj

    def save(self, d, state):
        self.saved.append(state["stage_step"])


def test_request_file_and_signal_are_seen_then_cleared(tmp_path):
    p = Preemption(tmp_path, OneRank(), is_driver=True)
    assert not p.requested()
    (tmp_path / REQUEST).touch()  # what slurm/ray_job.sbatch does on SIGUSR1
    assert p.requested()
    p.stopped(3)
    assert json.loads((tmp_path / MARKER).read_text())["step"] == 3 and not (tmp_path / REQUEST).exists()
    q = Preemption(tmp_path, OneRank(), is_driver=True)  # the requeued start
    assert not (tmp_path / MARKER).exists() and not q.requested()
    os.kill(os.getpid(), signal.SIGUSR1)  # SIGUSR1 to the driver itself
    assert q.requested()
    (tmp_path / REQUEST).touch()
    q.done()  # a run that finished drops a request that came too late
    assert not (tmp_path / REQUEST).exists()
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_a_non_driver_rank_follows_the_driver_and_writes_nothing(tmp_path):
    (tmp_path / REQUEST).touch()
    other = Preemption(tmp_path, OneRank(), is_driver=False)
    assert not other.requested()  # on one process the broadcast returns this rank's own False
    other.stopped(1)
    assert not (tmp_path / MARKER).exists()


def test_forced_checkpoint_is_written_once(tmp_path):
    t = OneRank()
    ck = StageCheckpoints(t, tmp_path, save_every=2, num_steps=6)
    ck.maybe_save(1, None)  # not due
    ck.maybe_save(1, None, force=True)  # preempted after step 1: saved
    ck.maybe_save(2, None)  # due
    ck.maybe_save(2, None, force=True)  # preempted after step 2: already saved by the schedule
    assert t.saved == [1, 2]
