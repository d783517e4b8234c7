"""The CUDA routes' buffer ring, on its own: a failed issue gives its buffer back only behind the stream."""

from __future__ import annotations

import queue

import pytest

pytestmark = pytest.mark.needs_package("cuda.bindings")   # pulseio._cuda imports it


def _ring(count: int):  # noqa: ANN202 (BufferRing, imported here)
    from pulseio._cuda.buffers import BufferRing

    ring = BufferRing.__new__(BufferRing)  # no pinned memory needed to test the bookkeeping
    ring._free = queue.SimpleQueue()
    ring._reclaim = lambda: False
    for i in range(count):
        ring._free.put(i)
    return ring


def test_a_failed_issue_returns_its_buffer_after_the_recorded_point() -> None:
    ring, emitted = _ring(1), []
    with pytest.raises(RuntimeError, match="launch failed"), ring.lease(emitted.append, lambda: "event-7") as index:
        assert index == 0
        raise RuntimeError("launch failed")
    assert ring._free.empty(), "the buffer must not be free before the stream passes the failure point"
    (pending,) = emitted
    assert pending.event == "event-7"
    pending.then()
    assert ring._free.get_nowait() == 0


def test_a_successful_lease_leaves_recycling_to_the_route() -> None:
    ring, emitted = _ring(2), []
    with ring.lease(emitted.append, lambda: "unused") as index:
        emitted.append(("route", index))
    assert emitted == [("route", 0)]
    assert ring._free.get_nowait() == 1


def test_a_starved_lease_finishes_the_oldest_piece_itself() -> None:
    ring, reclaimed = _ring(1), []
    held = ring._free.get_nowait()  # the one buffer is in flight

    def reclaim() -> bool:  # what InFlight.reclaim does: finish the oldest piece, which frees its buffer
        reclaimed.append(held)
        ring._free.put(held)
        return True

    ring._reclaim = reclaim
    with ring.lease(lambda pending: None, lambda: None) as index:
        assert index == held
    assert reclaimed == [held]
