"""The doorbell ring protocol on the CPU: publish/read, order, laps, bad counts, waiting without the GIL."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from pulseio import ClosedError, RingLayout, WaitTimeout, WouldBlock
from pulseio._native import ring
from pulseio.testing import ManualDoorbell


def test_layout_rules() -> None:
    with pytest.raises(ValueError, match=r"^a doorbell ring needs capacity >= 2 slots, got 1$"):
        RingLayout(1, 8)
    with pytest.raises(ValueError, match=r"^a doorbell slot needs max_blocks >= 1, got 0$"):
        RingLayout(4, 0)
    layout = RingLayout(4, 8)
    assert layout.slot_words % 16 == 0 and layout.slot_words >= 8 + 16


def test_native_is_used() -> None:
    assert ring.NATIVE, "numba is installed here: the GIL-free reader must be the compiled one"


def test_publish_then_read_returns_payload_in_order() -> None:
    bell = ManualDoorbell(capacity=4, max_blocks=8)
    assert bell.publish(np.array([3, 1, 2]), np.array([7, 8, 9]), tag=42) == 1
    assert bell.publish(np.array([5]), np.array([0]), tag=43, stamp_ns=123) == 2
    first, second = bell.poll_nowait()
    assert (first.seq, first.tag, first.error) == (1, 42, None)
    assert first.host_ids.tolist() == [3, 1, 2] and first.device_slots.tolist() == [7, 8, 9]
    assert (second.seq, second.tag, second.published_ns) == (2, 43, 123)
    with pytest.raises(WouldBlock, match=r"^no request published at seq 3 yet$"):
        bell.poll_nowait()


def test_reader_waits_for_the_next_seq_even_if_later_ones_are_published() -> None:
    bell = ManualDoorbell(capacity=8)
    bell.publish_simple(2)
    bell.publish_simple(3)
    with pytest.raises(WouldBlock):
        bell.poll_nowait()
    bell.publish_simple(1)
    assert [r.seq for r in bell.poll_nowait()] == [1, 2, 3]


def test_a_slot_being_written_is_not_read() -> None:
    bell = ManualDoorbell(capacity=4)
    bell.begin_write(1)
    assert bell.slot_seq(1) == -1
    with pytest.raises(WouldBlock):
        bell.poll_nowait()
    bell.publish_simple(1, 2)
    (rung,) = bell.poll_nowait()
    assert rung.host_ids.tolist() == [1000, 1001]


def test_lapped_requests_are_reported_lost_not_mixed() -> None:
    bell = ManualDoorbell(capacity=4)
    for seq in range(1, 7):  # 5 and 6 overwrite the slots of 1 and 2
        bell.publish_simple(seq)
    rungs = bell.poll_nowait()
    assert [(r.seq, r.error is None) for r in rungs] == [(1, False), (2, False), (3, True), (4, True)]
    assert "seq=1 was overwritten before the poller read it" in rungs[0].error
    assert "capacity=4" in rungs[0].error
    assert [(r.seq, r.host_ids.tolist()) for r in bell.poll_nowait()] == [(5, [5000]), (6, [6000])]
    stats = bell.statistics()
    assert (stats.lost, stats.delivered, stats.next_seq) == (2, 4, 7)


def test_bad_count_fails_only_that_request() -> None:
    bell = ManualDoorbell(capacity=4, max_blocks=4)
    bell.publish(np.arange(2), np.arange(2), tag=9, count=5)
    bell.publish(np.arange(2), np.arange(2), tag=10, count=-1)
    bell.publish(np.arange(2), np.arange(2), tag=11)
    bad, negative, good = bell.poll_nowait()
    assert bad.error == "doorbell request seq=1 tag=9 asked for 5 blocks; a request holds 0..4 (max_blocks_per_request)"
    assert negative.error is not None and good.error is None and good.host_ids.tolist() == [0, 1]


def test_count_beyond_the_arrays_publishes_invalid_ids() -> None:
    bell = ManualDoorbell(capacity=4, max_blocks=8)
    bell.publish(np.arange(2), np.arange(2), count=3)
    (rung,) = bell.poll_nowait()
    assert rung.host_ids.tolist() == [0, 1, -1]  # the poller's range check rejects it


def test_wait_rung_times_out_and_counts_spurious_wakeups() -> None:
    bell = ManualDoorbell(capacity=4, spin_iterations=1000)
    start = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"^no request published at seq 1 within 0.02 s$"):
        bell.wait_rung(timeout=0.02)
    assert time.monotonic() - start >= 0.02
    assert bell.statistics().spurious_wakeups == 1


def test_wait_rung_wakes_on_publish_and_batches() -> None:
    bell = ManualDoorbell(capacity=16)
    timer = threading.Timer(0.01, lambda: [bell.publish_simple(s) for s in (1, 2, 3)])
    timer.start()
    seen: list[int] = []
    while len(seen) < 3:
        seen += [r.seq for r in bell.wait_rung(timeout=2.0)]
    timer.join()
    assert seen == [1, 2, 3]
    assert bell.statistics().wakeups >= 1


def test_spinning_reader_does_not_hold_the_gil() -> None:
    bell = ManualDoorbell(capacity=4, spin_iterations=50_000_000, sleep_s=(1e-3, 1e-3))
    counter = [0]
    stop = threading.Event()

    def count() -> None:
        while not stop.is_set():
            counter[0] += 1

    reader = threading.Thread(target=bell.wait_rung, kwargs={"timeout": 5.0})  # ends at the publish below
    reader.start()
    time.sleep(0.02)  # the reader is now inside its long nogil spin
    worker = threading.Thread(target=count)
    worker.start()
    time.sleep(0.1)
    stop.set()
    worker.join()
    bell.publish_simple(1)
    reader.join()
    assert counter[0] > 10_000, "a Python thread made no progress while the reader spun"


def test_closed_doorbell_raises() -> None:
    bell = ManualDoorbell()
    bell.close()
    with pytest.raises(ClosedError, match=r"^this Doorbell is closed$"):
        bell.poll_nowait()
    with pytest.raises(ClosedError):
        bell.publish_simple(1)


def test_slot_state_says_where_a_request_stands() -> None:
    bell = ManualDoorbell(capacity=2, max_blocks=4)
    assert bell.slot_state(1) == "doorbell slot of seq 1: not published (the slot still holds seq 0); " \
                                 "the poller reads seq 1 next"
    bell.publish(np.array([1]), np.array([2]))
    assert bell.slot_state(1).startswith("doorbell slot of seq 1: published;")
    row = bell.words[: bell.layout.slot_words]
    row[0] = -3                                  # a producer of seq 3 (one lap on) has started writing
    assert bell.slot_state(3).startswith("doorbell slot of seq 3: being published")
    assert bell.slot_state(1).startswith("doorbell slot of seq 1: overwritten by seq 3")
