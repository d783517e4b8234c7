"""InFlight: pieces finish in order, on the thread that needs them; watched transfers finish alone."""

from __future__ import annotations

import threading

import pytest

from pulseio._inflight import InFlight, Issue
from pulseio._once import Latch
from pulseio.backend import Pending
from pulseio.errors import PulseInternalError


class _Event:
    """A device event the test completes by hand; synchronize waits for it."""

    def __init__(self) -> None:
        self.fired = threading.Event()
        self.waited_on: list[str] = []

    def synchronize(self) -> None:
        self.waited_on.append(threading.current_thread().name)
        self.fired.wait(5)


class _Handle:
    """The part of a Transfer that InFlight touches."""

    def __init__(self) -> None:
        self._issued = Latch()
        self._finished = Latch()
        self.finished_on: str | None = None


def _inflight(log: list) -> InFlight:
    def resolve(issue: Issue) -> None:
        for handle in issue.batch:
            handle.finished_on = threading.current_thread().name
            log.append(("resolved", handle, issue.error))
            handle._finished.set()

    return InFlight(lambda e: e.synchronize(), lambda e: e.fired.is_set(), resolve)


def _issue(inflight: InFlight, handle: _Handle, event: _Event, then=None) -> Issue:
    issue = Issue([handle])
    inflight.piece(issue, Pending(event, then))
    handle._issued.set()
    inflight.marker(issue)
    return issue


def test_a_waiter_finishes_its_transfer_and_every_older_one_on_its_own_thread() -> None:
    log: list = []
    inflight = _inflight(log)
    first, second = _Handle(), _Handle()
    e1, e2 = _Event(), _Event()
    recycled: list[str] = []
    _issue(inflight, first, e1, then=lambda: recycled.append("buffer 1"))
    _issue(inflight, second, e2)
    e1.fired.set()
    e2.fired.set()
    inflight.finish(second)
    me = threading.current_thread().name
    assert [entry[1] for entry in log] == [first, second], "pieces finish in issue order"
    assert first.finished_on == second.finished_on == me
    assert e1.waited_on == [me] and recycled == ["buffer 1"]
    inflight.stop()


def test_poll_finishes_only_what_has_landed() -> None:
    log: list = []
    inflight = _inflight(log)
    first, second = _Handle(), _Handle()
    e1, e2 = _Event(), _Event()
    _issue(inflight, first, e1)
    _issue(inflight, second, e2)
    inflight.poll()
    assert log == []
    e1.fired.set()
    inflight.poll()
    assert [entry[1] for entry in log] == [first]
    assert not second._finished.is_set()
    e2.fired.set()
    inflight.stop()  # drains
    assert second._finished.is_set()


def test_a_watched_transfer_finishes_with_nobody_waiting() -> None:
    log: list = []
    inflight = _inflight(log)
    handle, event = _Handle(), _Event()
    inflight.watch(handle)  # watched before it is even issued
    _issue(inflight, handle, event)
    event.fired.set()
    assert handle._finished.wait(5)
    assert handle.finished_on == "pulseio-dma-completion"
    inflight.stop()


def test_a_failing_piece_fails_its_issue_and_still_recycles() -> None:
    log: list = []
    inflight = _inflight(log)
    handle, event = _Handle(), _Event()
    event.fired.set()
    boom = RuntimeError("illegal address")

    def then() -> None:
        raise boom

    issue = _issue(inflight, handle, event, then=then)
    inflight.finish(handle)
    assert issue.error is boom and log[-1][2] is boom
    inflight.stop()


def test_reclaim_reports_when_nothing_is_in_flight() -> None:
    inflight = _inflight([])
    assert inflight.reclaim() is False
    handle, event = _Handle(), _Event()
    _issue(inflight, handle, event)
    event.fired.set()
    assert inflight.reclaim() is True  # the piece, and the marker right behind it in the same step
    assert handle._finished.is_set()
    assert inflight.reclaim() is False
    inflight.stop()


def test_drain_refuses_to_lose_items(monkeypatch: pytest.MonkeyPatch) -> None:
    inflight = _inflight([])
    _issue(inflight, _Handle(), _Event())
    monkeypatch.setattr(inflight, "step", lambda block: False)  # a consumer that never makes progress
    with pytest.raises(PulseInternalError, match="in-flight items left"):
        inflight.drain()
    monkeypatch.undo()
    inflight._items.clear()
    inflight.stop()
