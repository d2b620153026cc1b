"""The vLLM engine's gate between requests and weight syncs (`SyncGate`), without vLLM: the order of
events it enforces. The vLLM tier runs it inside the real engine (test_vllm_engine.py)."""

import threading
import time

import pytest

from hymem_train.engines.vllm_engine import SyncGate


def _later(fn, *args):
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def test_close_waits_until_the_requests_in_the_engine_have_left():
    gate, closed = SyncGate(), threading.Event()
    gate.enter(2)
    t = _later(lambda: (gate.close(), closed.set()))
    time.sleep(0.1)
    assert not closed.is_set() and gate.closed  # new requests are already held back
    gate.leave()
    time.sleep(0.1)
    assert not closed.is_set()
    gate.leave()
    t.join(5)
    assert closed.is_set() and gate.in_flight == 0


def test_requests_that_arrive_during_a_sync_wait_for_its_end():
    gate, order = SyncGate(), []
    gate.close()
    blocking = _later(lambda: (gate.enter(), order.append("generate")))
    gate.admit(lambda: order.append("submit"))  # never blocks: the gateway's event loop calls it
    time.sleep(0.1)
    assert order == [] and gate.in_flight == 0
    order.append("sync done")
    gate.open()
    blocking.join(5)
    assert order[0] == "sync done" and sorted(order[1:]) == ["generate", "submit"]
    assert gate.in_flight == 2  # each one leaves when its output is back


def test_an_open_gate_lets_requests_straight_in():
    gate, ran = SyncGate(), []
    gate.admit(lambda: ran.append(1))
    gate.enter()
    assert ran == [1] and gate.in_flight == 2 and not gate.closed


def test_a_request_that_never_leaves_fails_the_sync_by_name_and_reopens_the_gate():
    gate = SyncGate(timeout_s=0.2)
    gate.enter()
    with pytest.raises(TimeoutError, match=r"1 request\(s\) still in the vLLM engine after 0 s"):
        gate.close()
    assert not gate.closed  # the sync did not start: the engine still serves the old weights
    gate.enter()


def test_a_sync_that_never_ends_fails_the_waiting_request_by_name():
    gate = SyncGate(timeout_s=0.2)
    gate.close()
    with pytest.raises(TimeoutError, match=r"waited 0 s for a vLLM weight sync to end"):
        gate.enter()
    assert gate.in_flight == 0
