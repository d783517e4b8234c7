"""Property tests of the ring protocol (hypothesis): whatever order producers publish in, the reader
delivers each seq once, in order, with its own payload, or reports it lost; never a mixed payload."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pulseio import Rung, WouldBlock
from pulseio.testing import ManualDoorbell

# a schedule: each step reads (< 0) or publishes the k-th publishable seq (>= 0)
schedules = st.lists(st.integers(-3, 6), min_size=1, max_size=120)


def _poll(bell: ManualDoorbell) -> list[Rung]:
    """Everything readable now (one read returns at most `capacity` requests)."""
    rungs: list[Rung] = []
    while True:
        try:
            rungs += bell.poll_nowait()
        except WouldBlock:
            return rungs


def _payload(seq: int, n: int) -> list[int]:
    return [seq * 97 + i for i in range(n)]


@settings(max_examples=80, deadline=None)
@given(schedule=schedules, capacity=st.sampled_from([2, 3, 4, 8]), total=st.integers(1, 40))
def test_in_window_publishes_are_all_delivered_in_order(schedule: list[int], capacity: int, total: int) -> None:
    """Producers publish out of order but never more than `capacity` ahead of the reader."""
    bell = ManualDoorbell(capacity=capacity, max_blocks=4)
    unpublished, delivered = list(range(1, total + 1)), []

    def read() -> None:
        for rung in _poll(bell):
            assert rung.error is None
            assert rung.tag == rung.seq and rung.host_ids.tolist() == _payload(rung.seq, rung.seq % 5)
            delivered.append(rung.seq)

    for step in schedule:
        window = [s for s in unpublished if s < bell.next_seq + capacity]
        if step < 0 or not window:
            read()
            continue
        seq = window[step % len(window)]
        unpublished.remove(seq)
        n = seq % 5
        bell.publish_at(seq, np.array(_payload(seq, n), dtype=np.int64), np.arange(n), tag=seq)
    while unpublished:  # finish in order, reading first so the rest stays in the window
        read()
        seq = unpublished.pop(0)
        bell.publish_at(seq, np.array(_payload(seq, seq % 5), dtype=np.int64), np.arange(seq % 5), tag=seq)
        read()
    read()
    assert delivered == list(range(1, total + 1))
    assert bell.statistics().lost == 0


@settings(max_examples=80, deadline=None)
@given(schedule=schedules, capacity=st.sampled_from([2, 3, 4]), total=st.integers(1, 30))
def test_laps_lose_requests_but_never_mix_payloads(schedule: list[int], capacity: int, total: int) -> None:
    """In-order producers that may run any distance ahead: every seq is reported exactly once,
    either intact (its own payload) or lost, and one is lost only if a later one took its slot."""
    bell = ManualDoorbell(capacity=capacity, max_blocks=4)
    published, reports = 0, {}

    def read() -> None:
        for rung in _poll(bell):
            assert rung.seq not in reports
            if rung.error is None:
                assert rung.host_ids.tolist() == _payload(rung.seq, 2)
            else:
                assert rung.seq + capacity <= published  # a later seq really took its slot
            reports[rung.seq] = rung.error is None

    for step in schedule + [0] * total:
        if step < 0 or published == total:
            read()
        else:
            published += 1
            bell.publish_at(published, np.array(_payload(published, 2)), np.arange(2), tag=published)
    read()
    assert sorted(reports) == list(range(1, total + 1))
    assert bell.statistics().lost == sum(not ok for ok in reports.values())
