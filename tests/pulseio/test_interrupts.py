"""Completion, the completion watermark, and the interrupt pump (no runtime, no loop import below it)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulseio import InterruptPump, PulseInternalError, TransferError
from pulseio.interrupts import Completion, CompletionOrder


def _completion(seq: int = 1) -> Completion:
    return Completion(seq=seq, tag=seq, device_waiter=lambda c, s: None, awaiter=lambda c: None)


def test_completion_wait_timeout_then_done() -> None:
    c = _completion()
    assert not c.done() and c.wait(timeout=0.01) is False
    threading.Timer(0.01, c._finish, args=(None,)).start()
    assert c.wait(timeout=5) is True and c.done() and c.exception() is None and c.landed_ns is not None


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
    with pytest.raises(PulseInternalError, match="finished twice"):
        c._finish(None)


def test_order_releases_only_contiguous_prefixes() -> None:
    order = CompletionOrder()
    assert order.ready(2, "b") == [] and order.watermark == 0 and order.waiting == 1
    assert order.ready(1, "a") == ["a", "b"] and order.watermark == 2
    with pytest.raises(PulseInternalError, match="marked ready twice"):
        order.ready(2)


@settings(max_examples=100, deadline=None)
@given(st.permutations(list(range(1, 40))))
def test_order_watermark_is_monotone_and_exact(perm: list[int]) -> None:
    order, released, done = CompletionOrder(), [], set()
    for seq in perm:
        before = order.watermark
        released += order.ready(seq, seq)
        done.add(seq)
        assert order.watermark >= before
        assert all(s in done for s in range(1, order.watermark + 1))  # never ahead of a missing seq
        assert order.watermark + 1 not in done
    assert released == list(range(1, 40))


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
