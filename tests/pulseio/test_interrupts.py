"""Completion and the interrupt pump (no runtime, no loop import below it)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pulseio import InterruptPump, TransferError, WaitTimeout
from pulseio.interrupts import Completion


def _completion(seq: int = 1) -> Completion:
    return Completion(seq=seq, tag=seq, device_waiter=lambda c, s: None, awaiter=lambda c: None)


def test_completion_wait_timeout_then_done() -> None:
    c = _completion()
    with pytest.raises(WaitTimeout):
        c.wait(timeout=0.01)
    assert not c.done()
    threading.Timer(0.01, c._finish, args=(None,)).start()
    assert c.wait(timeout=5) is c and c.done() and c.exception() is None and c.finished_ns is not None


def test_completion_failure_reaches_waiter_and_callbacks_once() -> None:
    c, seen = _completion(), []
    c.add_done_callback(seen.append)
    c._finish(TransferError("doorbell request seq=1 tag=1: boom"))
    with pytest.raises(TransferError, match=r"^doorbell request seq=1 tag=1: boom$"):
        c.wait()
    c.add_done_callback(seen.append)  # already done: runs now
    assert seen == [c, c]
    with pytest.raises(TransferError):
        c.device_wait()
    assert c._finish(None) is False and c.exception() is not None  # a late landing changes nothing


def test_pump_batches_a_burst_into_one_loop_wakeup() -> None:
    scheduled: list[Any] = []
    pump = InterruptPump(scheduled.append)
    cs, delivered = [_completion(i) for i in range(1, 6)], []
    for c in cs:
        pump.watch(c, delivered.append)
    for c in cs:
        c._finish(None)
    assert len(scheduled) == 1 and delivered == []  # nothing runs off the loop
    scheduled.pop()()
    assert delivered == cs
    stats = pump.statistics()
    assert (stats.delivered, stats.loop_wakeups) == (5, 1)
