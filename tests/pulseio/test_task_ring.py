"""The resident copier's task ring on the host (`pulseio._native.task_ring`): posting, the stop handshake
word, and the doorbell fast lane (`forward`), which must take exactly the requests `make_plan` accepts."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from pulseio._native import task_ring as tr
from pulseio._native.layout import OUT_COLUMNS
from pulseio._resident import TaskRing
from pulseio.doorbell import Doorbell, RingLayout
from pulseio.host_backend import HostBackend

pytest.importorskip("numba")

SLOTS, CAP, NUM_HOST, NUM_SLOTS = 4, 8, 64, 16


class _TaskRing:
    """The host memory of a copier's ring, as numpy arrays (what ResidentCopier keeps in pinned memory)."""

    def __init__(self) -> None:
        self.ctrl = np.zeros(tr.CTRL_WORDS, np.int64)
        self.entries = np.zeros((SLOTS, tr.ENTRY_WORDS), np.int64)
        self.done = np.zeros(SLOTS, np.int64)
        self.ids = np.zeros((SLOTS, 2 * CAP), np.int64)
        self.row_task = np.zeros(4, np.int64)  # the task that last named each ids-mirror row

    @property
    def seq(self) -> int:
        return int(self.ctrl[tr.CTRL_SEQ])

    def reader(self, fast: np.ndarray, raise_at: int, raise_slots: int = 4, mirror_rows: int = 0):
        def forward(base, words, capacity, slot_words, max_blocks, next_seq, out, ids_out, slots_out, spin):
            k, stopped = tr.forward(
                spin, base, words, capacity, slot_words, max_blocks, next_seq, fast, NUM_HOST, NUM_SLOTS, self.ids,
                self.entries, self.entries.ctypes.data, self.done, self.ctrl.ctypes.data, raise_at, raise_slots,
                mirror_rows, self.row_task[:mirror_rows], out, ids_out, slots_out)
            if k > 0:  # the stop word read behind the last promise
                self.stopped = stopped
            return k

        return forward

    def task(self, seq: int) -> tuple[int, int, int]:
        """(seq as the task word keeps it, direction, count) of task seq's slot; its mirror row: `row`."""
        word = int(self.entries[(seq - 1) % SLOTS, tr.ENTRY_TASK])
        return word >> tr.SEQ_SHIFT, (word >> tr.COUNT_BITS) & 1, word & tr.MAX_TASK_BLOCKS

    def row(self, seq: int) -> int:
        """The device-mirror row task seq names, or -1 (its ids are in its slot)."""
        word = int(self.entries[(seq - 1) % SLOTS, tr.ENTRY_TASK])
        return (word >> tr.ROW_SHIFT) & (tr.MAX_MIRROR_ROWS - 1) if (word >> tr.MIRROR_BIT) & 1 else -1


@pytest.fixture
def doorbell() -> Doorbell:
    layout = RingLayout(8, 16)
    return Doorbell(HostBackend().alloc_host(layout.nbytes, label="ring"), layout)


def test_the_lane_posts_valid_requests_and_leaves_each_it_cannot_take_to_the_regular_read(doorbell: Doorbell) -> None:
    ring, fast = _TaskRing(), np.zeros(8, np.int64)
    requests = [
        ([3, 9, 60], [0, 1, 2]),  # 1: posted as task 1
        ([5], [7]),  # 2: posted as task 2
        ([4, 4], [3, 3]),  # 3: a repeated destination slot: make_plan refuses it, so the lane does too
        ([1], [1]),  # 4: the lane goes on after the refused one: task 3
    ]
    for seq, (ids, slots) in enumerate(requests, start=1):
        doorbell.publish(np.array(ids), np.array(slots), tag=10 + seq)
        fast[(seq - 1) % 8] = seq
    ring.ctrl[tr.CTRL_STOPPED] = 7  # what the kernel last wrote: returned to the caller as read after the promise
    rungs = doorbell.wait_rung(timeout=1, lane=ring.reader(fast, raise_at=0xA0, raise_slots=2))
    assert [(r.seq, r.task, r.tag) for r in rungs] == [(1, 1, 11), (2, 2, 12), (3, 0, 13), (4, 3, 14)]
    assert rungs[2].error is None and rungs[2].host_ids.tolist() == [4, 4]  # read alone, the regular way
    assert ring.task(1) == (1, tr.H2D, 3) and ring.task(2) == (2, tr.H2D, 1)
    assert ring.ids[0, :3].tolist() == [3, 9, 60] and ring.ids[0, CAP : CAP + 3].tolist() == [0, 1, 2]
    assert ring.ids[1, 0] == 5 and ring.ids[1, CAP] == 7
    # each task sets its own request's wait word (base + 8 * ((seq - 1) % raise_slots)) to that seq
    assert ring.entries[:3, tr.ENTRY_RAISE_AT].tolist() == [0xA0, 0xA8, 0xA8]
    assert ring.entries[:3, tr.ENTRY_RAISE_TO].tolist() == [1, 2, 4]
    assert fast.tolist() == [0, 0, 3, 0, 0, 0, 0, 0]  # the lane cleared the marks of what it took
    assert ring.ctrl[tr.CTRL_PROMISED] == 3 and ring.stopped == 7 and ring.seq == 3


def test_with_a_device_mirror_the_lane_names_each_request_s_row_instead_of_copying_its_ids(
        doorbell: Doorbell) -> None:
    ring, fast = _TaskRing(), np.zeros(8, np.int64)
    for seq, (ids, slots) in enumerate([([3, 9], [0, 1]), ([5], [7]), ([6], [2])], start=1):
        doorbell.publish(np.array(ids), np.array(slots))
        fast[seq - 1] = seq
    rungs = doorbell.wait_rung(timeout=1, lane=ring.reader(fast, raise_at=0xA0, raise_slots=2, mirror_rows=2))
    assert [r.task for r in rungs] == [1, 2, 3]
    assert [ring.row(t) for t in (1, 2, 3)] == [0, 1, 0]  # the wait words' slots: (seq - 1) % 2
    assert ring.task(1) == (1, tr.H2D, 2) and ring.task(3) == (3, tr.H2D, 1)
    assert not ring.ids.any(), "ids stay in the mirror: nothing copied into the task slots"
    assert ring.entries[:3, tr.ENTRY_RAISE_AT].tolist() == [0xA0, 0xA8, 0xA0]
    assert ring.row_task[:2].tolist() == [3, 2]  # the task that reads each row now


def test_a_mirror_row_stays_busy_until_the_task_that_reads_it_has_landed() -> None:
    ring = TaskRing(HostBackend().alloc_host, slots=SLOTS, cap=CAP)
    assert ring.mirror_row_busy(5) == 0  # no mirror: never busy
    ring.mirror_rows, ring._row_task = 2, np.array([3, 0], np.int64)  # as `read_ids_from` and the lane leave them
    assert ring.mirror_row_busy(5) == 3, "request 5 writes row 0, which task 3 has yet to read"
    assert ring.mirror_row_busy(6) == 0, "row 1 was never named"
    ring._done[2] = 3  # task 3 landed
    assert ring.mirror_row_busy(5) == 0
    ring.close()


def test_a_task_word_tells_its_seq_from_an_earlier_lap_across_the_seq_field_s_wrap() -> None:
    for seq in (1, 5, tr.SEQ_MASK, tr.SEQ_MASK + 1, tr.SEQ_MASK + 7, 3 * (tr.SEQ_MASK + 1) + 2):
        for row in (-1, 0, tr.MAX_MIRROR_ROWS - 1):
            word = int(tr.pack_entry(seq, tr.MAX_TASK_BLOCKS, tr.D2H, row))
            assert 0 <= word < 2**63 and tr.entry_holds(word, seq) and not tr.entry_holds(word, seq - SLOTS)
            assert word & tr.MAX_TASK_BLOCKS == tr.MAX_TASK_BLOCKS and (word >> tr.COUNT_BITS) & 1 == tr.D2H
            assert ((word >> tr.ROW_SHIFT) & (tr.MAX_MIRROR_ROWS - 1) if (word >> tr.MIRROR_BIT) & 1 else -1) == row


@pytest.mark.parametrize(("ids", "slots", "why"), [
    ([NUM_HOST], [0], "host id out of range"),
    ([0], [NUM_SLOTS], "slot out of range"),
    (list(range(CAP + 1)), list(range(CAP + 1)), "more blocks than a task holds"),
    ([], [], "nothing to copy"),
])
def test_forward_leaves_what_it_cannot_take_to_the_regular_read(doorbell: Doorbell, ids, slots, why) -> None:
    ring, fast = _TaskRing(), np.array([1] + [0] * 7, np.int64)
    doorbell.publish(np.array(ids, np.int64), np.array(slots, np.int64))
    (rung,) = doorbell.wait_rung(timeout=1, lane=ring.reader(fast, raise_at=0))
    assert rung.task == 0 and ring.seq == 0 and ring.ctrl[tr.CTRL_PROMISED] == 0, why


def test_forward_takes_only_marked_seqs_and_waits_for_a_free_task_slot(doorbell: Doorbell) -> None:
    ring, fast = _TaskRing(), np.zeros(8, np.int64)
    for seq in range(1, 7):
        doorbell.publish(np.array([seq]), np.array([seq]))
    fast[:6] = [1, 2, 3, 4, 5, 0]  # seq 6 was posted for another route; fast[...] holding seq 5 marks seq 5 only
    rungs = doorbell.wait_rung(timeout=1, lane=ring.reader(fast, raise_at=0))
    # four task slots, none landed yet: tasks 1-4 are posted, seq 5 waits for slot 1 and goes the regular way
    assert [r.task for r in rungs] == [1, 2, 3, 4, 0, 0]
    ring.done[0] = 1  # task 1 landed: its slot is free again
    doorbell.publish(np.array([9]), np.array([9]))
    fast[6] = 7
    (rung,) = doorbell.wait_rung(timeout=1, lane=ring.reader(fast, raise_at=0))
    assert rung.seq == 7 and rung.task == 5 and ring.task(5) == (5, tr.H2D, 1)


def test_post_writes_the_task_promises_it_and_reports_the_stop_word() -> None:
    ring = _TaskRing()
    ring.ctrl[tr.CTRL_STOPPED] = 3

    def post(ids, slots, direction=tr.D2H, publish=True):
        return tr.post(ring.ctrl.ctypes.data, ring.ids, ring.entries, ring.entries.ctypes.data, ring.done,
                       np.array(ids, np.int64), np.array(slots, np.int64), direction, 0xAB, 9, publish)

    assert post([5, 6], [1, 2]) == (1, 3)
    assert ring.task(1) == (1, tr.D2H, 2) and ring.ctrl[tr.CTRL_PROMISED] == 1 and ring.seq == 1
    assert ring.ids[0, :2].tolist() == [5, 6] and ring.ids[0, CAP : CAP + 2].tolist() == [1, 2]
    assert ring.entries[0, tr.ENTRY_RAISE_AT] == 0xAB and ring.entries[0, tr.ENTRY_RAISE_TO] == 9
    assert post([7], [3], publish=False) == (2, 3)  # a stream writes the task word later
    assert ring.entries[1, tr.ENTRY_TASK] == 0 and ring.ctrl[tr.CTRL_PROMISED] == 2
    assert post([1], [1]) == (3, 3) and post([2], [2]) == (4, 3)
    assert post([4], [4]) == (0, 5)  # slot 0 still holds task 1, not landed: nothing written
    assert ring.seq == 4 and ring.ctrl[tr.CTRL_PROMISED] == 4
    assert ring.ctrl[tr.CTRL_TICKET] == ring.ctrl[tr.CTRL_SERVING]  # the lock was given back
    ring.done[0] = 1
    assert post([4], [4]) == (5, 3) and ring.task(5) == (5, tr.D2H, 1)
    assert tr.wait_at_least(ring.ctrl.ctypes.data, 5, 10) == 1 and tr.wait_at_least(ring.ctrl.ctypes.data, 6, 10) == 0


def test_the_lane_spins_for_the_next_request_and_stamps_when_it_saw_it(doorbell: Doorbell) -> None:
    ring, fast = _TaskRing(), np.array([1] + [0] * 7, np.int64)
    lane = ring.reader(fast, raise_at=0)
    layout = doorbell.layout
    args = (doorbell.base, doorbell.words, layout.capacity, layout.slot_words, layout.blocks_per_slot, 1,
            np.zeros((8, OUT_COLUMNS), np.int64), np.zeros(8 * 16, np.int64), np.zeros(8 * 16, np.int64))
    assert lane(*args, 1000) == -1 and ring.seq == 0  # nothing published: -1, nothing posted
    before = time.perf_counter_ns()
    doorbell.publish(np.array([2]), np.array([3]))
    (rung,) = doorbell.wait_rung(timeout=1, lane=lane)
    assert rung.task == 1 and before <= rung.seen_ns <= time.perf_counter_ns()


@pytest.mark.slow
def test_posters_exclude_each_other_through_the_ticket_lock() -> None:
    """Two threads incrementing a plain (non-atomic) word under tr.lock never lose an update."""
    ctrl, counter = np.zeros(tr.CTRL_WORDS, np.int64), np.zeros(1, np.int64)

    def bump(times: int) -> None:
        for _ in range(times):
            tr.lock(ctrl.ctypes.data)
            value = int(counter[0])
            time.sleep(0) if value % 97 == 0 else None  # invite a switch inside the critical section
            counter[0] = value + 1
            tr.unlock(ctrl.ctypes.data)

    threads = [threading.Thread(target=bump, args=(3000,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter[0] == 9000 and ctrl[tr.CTRL_TICKET] == ctrl[tr.CTRL_SERVING] == 9000
