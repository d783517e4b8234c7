"""Recaller.post: a recall published without its device wait, checked without waiting, waited for once."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

import pulseio
from pulseio_engine.config import RecallMode
from pulseio_engine.kv.recall import AHEAD_TAG, FLIGHT_SAMPLE_EVERY, PendingRecall, Recaller

CONFIG = pulseio.RuntimeConfig(device="cpu", host_blocks=64, device_slots=32, block_bytes=64, ring_slots=8,
                               max_blocks_per_request=16, spin_iterations=2000)


def _runtime() -> pulseio.Runtime:
    rt = pulseio.open_runtime(CONFIG)
    rt.host_pool.blocks[:] = torch.arange(64, dtype=torch.uint8)[:, None]      # host block b is all b
    return rt


def _args(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.tensor([9, 4, 33, 17, 0, 0], dtype=torch.int64)
    dst = torch.tensor([1, 2, 3, 4, 0, 0], dtype=torch.int64)
    return ids, dst, torch.tensor([n], dtype=torch.int64)


def test_a_posted_doorbell_recall_lands_without_its_wait_and_is_waited_once() -> None:
    with _runtime() as rt:
        recaller = Recaller(rt, RecallMode.DOORBELL)
        pending = recaller.post(*_args(4), tag=7)
        deadline = time.monotonic() + 10
        while not pending.landed_nowait():
            assert time.monotonic() < deadline, "the recall never landed without a device wait"
            time.sleep(1e-3)
        assert rt.device_pool.slots[1:5, 0].tolist() == [9, 4, 33, 17]
        done = pending.wait_device()
        assert done is pending.handle and pending.wait_device() is done and done.tag == 7
        recaller.check_landed()
        assert rt.statistics().submitted == rt.statistics().completed == 1


def test_wait_device_before_landing_waits_for_the_data() -> None:
    with _runtime() as rt:
        pending = Recaller(rt, RecallMode.DOORBELL).post(*_args(3), tag=1)
        pending.wait_device()                           # the host backend's device wait waits on the host
        assert pending.landed_nowait() and rt.device_pool.slots[1:4, 0].tolist() == [9, 4, 33]


def test_a_sync_post_has_landed_when_it_returns_and_an_empty_one_has_nothing_to_wait_for() -> None:
    with _runtime() as rt:
        recaller = Recaller(rt, RecallMode.SYNC)
        pending = recaller.post(*_args(2), tag=3)
        assert pending.landed_nowait() and rt.device_pool.slots[1:3, 0].tolist() == [9, 4]
        empty = recaller.post(*_args(0), tag=4)
        assert empty.handle is None and empty.landed_nowait() and empty.wait_device() is None


def test_recall_is_post_then_wait() -> None:
    with _runtime() as rt:
        done = Recaller(rt, RecallMode.DOORBELL).recall(*_args(2), tag=5)
        assert done.done() and rt.device_pool.slots[1:3, 0].tolist() == [9, 4]
    assert isinstance(PendingRecall(None, 0), PendingRecall)


class _FullThenRoom:
    """A RecallGraph stand-in whose ring is full for the first `full` looks (arm_nowait raises WouldBlock)."""

    def __init__(self, full: int) -> None:
        self.full, self.nowait_calls = full, 0

    def arm_nowait(self) -> list[pulseio.Completion]:
        self.nowait_calls += 1
        if self.nowait_calls <= self.full:
            raise pulseio.WouldBlock("ring full")
        return [pulseio.Completion(seq=7, tag=3, device_waiter=None, awaiter=None)]

    def arm(self, *, timeout: float | None = None) -> list[pulseio.Completion]:
        while True:
            try:
                return self.arm_nowait()
            except pulseio.WouldBlock:
                time.sleep(1e-3)


def test_arm_waits_only_for_room_and_counts_it_as_blocked() -> None:
    recaller = Recaller(runtime=None, mode=RecallMode.DOORBELL)
    done = recaller.arm(_FullThenRoom(full=0))
    assert [c.tag for c in done] == [3] and recaller.blocked_ns == 0, "room at once: no wait, nothing blocked"
    done = recaller.arm(_FullThenRoom(full=3))
    assert [c.tag for c in done] == [3] and recaller.blocked_ns >= 2_000_000, "three full looks: ~3 ms blocked"
    assert len(recaller._posted) == 2, "armed completions are watched by check_landed"


def test_check_landed_samples_the_flights_of_own_and_ahead_recalls_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """One check_landed call in FLIGHT_SAMPLE_EVERY samples its recalls' device stamps, a layer's own and those
    ahead (AHEAD_TAG) apart: stamped, bytes, landed early, publish -> landed early / -> landed."""
    from pulseio._resident import TaskEvent

    monkeypatch.setattr(TaskEvent, "early_landed_ns", lambda self: self.landed_ns() if self.seq % 2 == 0 else None)
    config = dataclasses.replace(CONFIG, strategy=pulseio.Strategy.RESIDENT)
    with pulseio.open_runtime(config) as rt:
        recaller = Recaller(rt, RecallMode.DOORBELL)
        sampled = []
        for call in range(1, 2 * FLIGHT_SAMPLE_EVERY + 1):
            posts = [recaller.post(*_args(n), tag=tag) for n, tag in ((4, 5), (2, 5 | AHEAD_TAG), (3, 6))]
            for p in posts:
                p.wait_device()
            deadline = time.monotonic() + 10
            while not all(p.handle.done() for p in posts):        # pulseio marks them a moment after the data
                assert time.monotonic() < deadline
                time.sleep(1e-3)
            recaller.check_landed()
            if call % FLIGHT_SAMPLE_EVERY == 0:
                sampled.extend(p.handle for p in posts)
        own, ahead = recaller.flights["own"].summary(), recaller.flights["ahead"].summary()
        assert (own["stamped"], ahead["stamped"]) == (4, 2), "two calls sampled, each 2 own recalls and 1 ahead"
        assert (own["bytes"], ahead["bytes"]) == (2 * 7 * CONFIG.block_bytes, 2 * 2 * CONFIG.block_bytes)
        early = {kind: [h for h in sampled if h.early_landed_ns is not None and (h.tag & AHEAD_TAG != 0) == kind]
                 for kind in (False, True)}
        assert (own["landed_early"], ahead["landed_early"]) == (len(early[False]), len(early[True]))
        assert 0 < own["landed_early"] + ahead["landed_early"] < len(sampled) == 6     # the tasks of even seqs
        assert own["publish_to_early_landed"].count == own["landed_early"]
        assert own["publish_to_landed"].count == 4 and own["publish_to_landed"].p50_us > 0
        spans = sorted((h.landed_ns - h.published_ns) / 1e3 for h in sampled if h.tag & AHEAD_TAG)
        assert ahead["publish_to_landed"].p50_us == pytest.approx(sum(spans) / 2, abs=1e-3)
        recaller.reset_flights()                                        # after a warm-up: from zero again
        assert all(f.stamped == f.landed_early == 0 and not f.to_landed_ns for f in recaller.flights.values())
