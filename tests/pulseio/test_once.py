"""Latch and Handle: every waiter wakes, timeouts change nothing, finishing twice is a bug."""

from __future__ import annotations

import threading
import time

import pytest

from pulseio import PulseInternalError, WaitTimeout
from pulseio._once import Latch
from pulseio.handle import Handle


def test_latch_wakes_every_waiter_and_times_out_unset() -> None:
    latch = Latch()
    assert not latch.is_set() and latch.wait(timeout=0.01) is False
    woke: list[int] = []
    threads = [threading.Thread(target=lambda i=i: woke.append(i) if latch.wait(5) else None) for i in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    assert woke == []
    latch.set()
    latch.set()  # idempotent
    for t in threads:
        t.join(5)
    assert sorted(woke) == list(range(6))
    assert latch.wait(timeout=0) and latch.wait()


def test_a_handle_runs_callbacks_once_and_refuses_a_second_finish() -> None:
    handle = Handle(seq=1, tag=None)
    calls: list[object] = []
    handle.add_done_callback(calls.append)
    with pytest.raises(WaitTimeout, match=r"has not finished after 0.01 s; it goes on"):
        handle.wait(timeout=0.01)
    assert not handle.done() and handle.finished_ns is None
    error = ValueError("boom")
    with handle._lock:
        callbacks = handle._finish_locked(error)
    for fn in callbacks:
        fn(handle)
    assert calls == [handle] and handle.done() and handle.exception() is error and handle.latency_s >= 0.01
    with pytest.raises(ValueError, match="boom"):
        handle.wait()
    with pytest.raises(PulseInternalError, match="finished twice"), handle._lock:
        handle._finish_locked(None)
