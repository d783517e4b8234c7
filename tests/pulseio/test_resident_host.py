"""The RESIDENT route's task ring on the CPU backend (`pulseio.resident`): the same ring and host protocol
as on the GPU, served by a thread, so posting, slot reuse, waiting and stamping run in CI."""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from pulseio._native import task_ring as tr
from pulseio.doorbell import Doorbell, RingLayout
from pulseio.host_backend import HostBackend
from pulseio.resident import HostResidentCopier


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
    finally:
        copier.close()


def test_a_task_raises_its_word_once_landed() -> None:
    copier, _, device = _copier()
    word = ctypes.c_int64(5)
    try:
        copier.post(tr.H2D, np.array([7]), np.array([3]), raise_on_landed=(ctypes.addressof(word), 9)).synchronize()
        copier.post(tr.H2D, np.array([8]), np.array([4]), raise_on_landed=(ctypes.addressof(word), 2)).synchronize()
        assert word.value == 9 and device[3, 0] == 7  # raised to 9, never lowered by the later, smaller value
    finally:
        copier.close()


def test_after_a_request_the_lane_refuses_its_later_tasks_do_not_raise_the_word() -> None:
    """Request 2 is not for the lane (another route): it may still be in flight when task 3 lands, so task 3
    must not raise the completion word past it; the poller's host signal covers both instead."""
    copier, _, device = _copier(slots=8, cap=8)
    layout = RingLayout(8, 16)
    doorbell = Doorbell(HostBackend().alloc_host(layout.nbytes, label="ring"), layout)
    word = ctypes.c_int64(0)
    fast = np.zeros(8, np.int64)
    try:
        for seq, lane in ((1, True), (2, False), (3, True)):
            doorbell.publish(np.array([seq]), np.array([seq]))
            fast[seq - 1] = seq if lane else 0
        rungs = doorbell.wait_rung(timeout=1, lane=copier.forwarder(fast, 64, 32, raise_at=ctypes.addressof(word)))
        assert [(r.seq, r.task, r.raised) for r in rungs] == [(1, 1, True), (2, 0, False), (3, 2, False)]
        copier.event(2).synchronize()
        assert word.value == 1 and device[1, 0] == 1 and device[3, 0] == 3  # only request 1 raised it
    finally:
        copier.close()
