"""The poller on its own: matching published seqs to completions, tags, and the watermark it signals."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from pulseio import DevicePool, DmaEngine, HostBackend, HostPool, TransferError
from pulseio.interrupts import Completion
from pulseio.plan import Direction, make_plan
from pulseio.poller import Poller
from pulseio.testing import ManualDoorbell


class _Signal:
    device_word = 0

    def __init__(self) -> None:
        self.watermarks: list[int] = []

    def signal(self, events: list[Any], watermark: int) -> None:
        self.watermarks.append(watermark)


@pytest.fixture
def setup():  # type: ignore[no-untyped-def]
    backend = HostBackend()
    host, dev = HostPool(backend, 64, 16), DevicePool(backend, 16, 16)
    engine = DmaEngine(host, dev)
    bell, signal = ManualDoorbell(capacity=8, max_blocks=4, spin_iterations=500), _Signal()
    plan = lambda h, d: make_plan(Direction.H2D, h, d, num_host_blocks=64, num_device_slots=16, block_bytes=16)
    poller = Poller(bell, [engine], signal, plan=plan)
    yield bell, poller, signal
    poller.stop()
    engine.close()


def _expect(poller: Poller, seq: int, tag: int | None) -> Completion:
    c = Completion(seq=seq, tag=tag, device_waiter=lambda c, s: None, awaiter=lambda c: None)
    from pulseio import Strategy

    poller.expect(c, Strategy.AUTO)
    return c


def test_unposted_publishes_are_served_and_counted_in_the_watermark(setup) -> None:  # type: ignore[no-untyped-def]
    bell, poller, signal = setup
    bell.publish_simple(1)  # nobody expects seq 1: it is recalled anyway, nobody waits
    second = _expect(poller, 2, None)
    bell.publish_at(2, np.array([4]), np.array([5]), tag=6)
    assert second.wait(timeout=10) and second.tag == 6
    deadline = time.monotonic() + 5
    while poller.statistics().watermark < 2 and time.monotonic() < deadline:
        time.sleep(1e-3)
    assert poller.statistics().watermark == 2 and signal.watermarks[-1] == 2


def test_a_payload_tag_other_than_the_posted_one_fails_that_request(setup) -> None:  # type: ignore[no-untyped-def]
    bell, poller, _ = setup
    c = _expect(poller, 1, 5)
    bell.publish_at(1, np.array([1]), np.array([1]), tag=6)
    with pytest.raises(TransferError, match=r"^doorbell request seq=1 carries tag 6 but the request posted as seq 1"):
        c.wait(timeout=10)


def test_empty_request_completes_without_a_copy(setup) -> None:  # type: ignore[no-untyped-def]
    bell, poller, _ = setup
    c = _expect(poller, 1, 0)
    bell.publish_at(1, np.zeros(0, np.int64), np.zeros(0, np.int64), tag=0)
    assert c.wait(timeout=10) and c.transfer is None and c.num_blocks == 0
