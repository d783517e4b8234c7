"""The RESIDENT route's task ring on the CPU backend (`pulseio._resident`): the same ring and host protocol
as on the GPU, served by a thread, so posting, slot reuse, waiting and stamping run in CI."""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from pulseio._native import task_ring as tr
from pulseio._resident import HostResidentCopier
from pulseio.doorbell import Doorbell, RingLayout
from pulseio.host_backend import HostBackend


def _copier(slots: int = 4, cap: int = 8):
    host = torch.arange(64, dtype=torch.uint8)[:, None].repeat(1, 16)  # [64, 16]: block b is all b
    device = torch.zeros(32, 16, dtype=torch.uint8)
    return HostResidentCopier(HostBackend().alloc_host, host, device, slots=slots, cap=cap), host, device


def test_tasks_land_in_order_through_more_tasks_than_slots() -> None:
    copier, host, device = _copier()
    try:
        events = [copier.post(tr.H2D, np.array([i, 40 + i]), np.array([2 * i, 2 * i + 1])) for i in range(12)]
        for event in events:
            event.synchronize()
            assert event.query()
        assert [e.seq for e in events] == list(range(1, 13))
        for i in range(12):
            assert device[2 * i, 0] == i and device[2 * i + 1, 0] == 40 + i
        back = copier.post(tr.D2H, np.array([63]), np.array([0]))  # device slot 0 (block 0) -> host block 63
        back.synchronize()
        assert bool((host[63] == 0).all())
        assert copier.landed_ns(back.seq) is not None and copier.landed_ns(1) is None  # slot reused since
        assert copier.taken_ns(back.seq) <= copier.landed_ns(back.seq) and copier.taken_ns(1) is None
    finally:
        copier.close()


def test_a_task_carries_its_early_landing_stamp_only_while_its_slot_holds_it() -> None:
    """ENTRY_EARLY_NS is the GPU server's stamp of a request that landed early (before its task): read as None
    when 0, and zeroed by the host as it posts the slot's next task, so a later lap never shows an old one."""
    copier, _, _ = _copier(slots=2)
    try:
        first = copier.post(tr.H2D, np.array([1]), np.array([1]))
        first.synchronize()
        assert first.early_landed_ns() is None                          # the host's server never lands early
        copier._entries[(first.seq - 1) % 2, tr.ENTRY_EARLY_NS] = 1234   # as the GPU's server stamps it
        assert first.early_landed_ns() == 1234 == copier.early_landed_ns(first.seq)
        copier.post(tr.H2D, np.array([2]), np.array([2])).synchronize()
        third = copier.post(tr.H2D, np.array([3]), np.array([3]))        # the first's slot again: zeroed as posted
        third.synchronize()
        assert third.early_landed_ns() is None and copier.early_landed_ns(first.seq) is None
    finally:
        copier.close()


def test_a_task_sets_its_word_once_landed() -> None:
    copier, _, device = _copier()
    words = (ctypes.c_int64 * 2)(0, 0)
    try:
        copier.post(tr.H2D, np.array([7]), np.array([3]), raise_on_landed=(ctypes.addressof(words), 9)).synchronize()
        assert words[0] == 9 and device[3, 0] == 7 and words[1] == 0
    finally:
        copier.close()


def test_the_lane_sets_each_request_word_and_leaves_refused_ones_to_the_poller() -> None:
    """Request 2 is not for the lane (another route): the lane takes 1 and 3 and sets their own words;
    word 2 stays for whoever serves request 2."""
    copier, _, device = _copier(slots=8, cap=8)
    layout = RingLayout(8, 16)
    doorbell = Doorbell(HostBackend().alloc_host(layout.nbytes, label="ring"), layout)
    words = (ctypes.c_int64 * 4)(0, 0, 0, 0)
    fast = np.zeros(8, np.int64)
    try:
        for seq, lane in ((1, True), (2, False), (3, True)):
            doorbell.publish(np.array([seq]), np.array([seq]))
            fast[seq - 1] = seq if lane else 0
        lane = copier.forwarder(fast, 64, 32, raise_base=ctypes.addressof(words), raise_slots=4)
        rungs = doorbell.wait_rung(timeout=1, lane=lane)
        assert [(r.seq, r.task, r.raised) for r in rungs] == [(1, 1, True), (2, 0, False), (3, 2, True)]
        copier.event(2).synchronize()
        assert list(words) == [1, 0, 3, 0] and device[1, 0] == 1 and device[3, 0] == 3
        assert list(fast[:3]) == [0, 0, 0]  # the lane clears the marks of what it took
    finally:
        copier.close()


def test_unmark_keeps_the_lane_off_a_request_it_has_not_taken() -> None:
    copier, _, _ = _copier(slots=8, cap=8)
    fast = np.array([1, 2, 0, 0], np.int64)
    try:
        assert copier.unmark(fast, 2) and list(fast) == [1, 0, 0, 0]
        assert not copier.unmark(fast, 2) and not copier.unmark(fast, 3)
    finally:
        copier.close()


def test_a_fence_names_the_row_of_a_request_the_lane_did_not_take_and_keeps_it_until_landed() -> None:
    copier, host, device = _copier()
    try:
        before = device.clone()
        copier.fence_row(3)  # no ids mirror: nothing to fence
        assert int(copier._ctrl[tr.CTRL_SEQ]) == 0 and copier.mirror_row_busy(5) == 0
        copier.mirror_rows, copier._row_task = 2, np.zeros(2, np.int64)  # as `read_ids_from` leaves them
        copier.fence_row(4)  # request 4: row 1
        task = int(copier._row_task[1])
        word = int(copier._entries[(task - 1) % copier.slots, tr.ENTRY_TASK])
        assert task == 1 and (word >> tr.MIRROR_BIT) & 1 and (word >> tr.ROW_SHIFT) & (tr.MAX_MIRROR_ROWS - 1) == 1
        assert word & tr.MAX_TASK_BLOCKS == 0, "a fence moves no blocks"
        copier.event(task).synchronize()
        assert copier.mirror_row_busy(6) == 0 and torch.equal(device, before)
    finally:
        copier.close()
