"""The poller on its own: matching published seqs to completions, tags, wait words, cancelling."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pulseio import DevicePool, DmaEngine, HostBackend, HostPool, Strategy, TransferError
from pulseio._poller import Poller
from pulseio._wait_words import WaitWords
from pulseio.interrupts import Completion
from pulseio.plan import Direction, make_plan
from pulseio.testing import ManualDoorbell


@pytest.fixture
def setup():  # type: ignore[no-untyped-def]
    backend = HostBackend()
    host, dev = HostPool(backend, 64, 16), DevicePool(backend, 16, 16)
    engine = DmaEngine(host, dev)
    bell = ManualDoorbell(capacity=8, max_blocks=4, spin_iterations=500)
    words = WaitWords(backend.alloc_host(8 * 16, label="wait words"), 16)
    plan = lambda h, d: make_plan(Direction.H2D, h, d, num_host_blocks=64, num_device_slots=16, block_bytes=16)
    poller = Poller(bell, [engine], words, plan=plan)
    yield bell, poller, words
    poller.stop()
    engine.close()


def _expect(poller: Poller, seq: int, tag: int | None, strategy: Strategy = Strategy.AUTO) -> Completion:
    c = Completion(seq=seq, tag=tag, device_waiter=lambda c, s: None, awaiter=lambda c: None, strategy=strategy)
    poller.expect(c)
    return c


@pytest.mark.parametrize("strategy", [Strategy.RESIDENT, Strategy.ZERO_COPY, Strategy.GATHER_DMA])
def test_every_request_sets_its_wait_word_once_served(setup, strategy: Strategy) -> None:  # type: ignore[no-untyped-def]
    bell, poller, words = setup
    bell.publish_simple(1)  # nobody expects seq 1: it is recalled anyway, nobody waits
    second = _expect(poller, 2, None, strategy)
    assert not words.reached(2)
    bell.publish_at(2, np.array([4]), np.array([5]), tag=6)
    assert second.wait(timeout=10) and second.tag == 6
    deadline = time.monotonic() + 5
    while not words.reached(1) and time.monotonic() < deadline:
        time.sleep(1e-3)
    assert words.reached(1) and words.reached(2) and not words.reached(3)
    stats = poller.statistics()  # seq 1 asks for host block 1000 of 64: refused, and counted
    assert (stats.completed, stats.failed) == (1, 1)


def test_a_failed_request_sets_its_word_too(setup) -> None:  # type: ignore[no-untyped-def]
    bell, poller, words = setup
    c = _expect(poller, 1, 0, Strategy.RESIDENT)
    bell.publish_at(1, np.array([64]), np.array([1]), tag=0)  # host id out of range
    with pytest.raises(TransferError, match=r"^doorbell request seq=1 tag=0: host_ids\[0\] = 64 is out of range"):
        c.wait(timeout=10)
    assert words.reached(1) and poller.statistics().failed == 1


def test_a_request_cancelled_before_it_is_read_is_never_copied(setup) -> None:  # type: ignore[no-untyped-def]
    bell, poller, words = setup
    c = _expect(poller, 1, 0, Strategy.RESIDENT)
    assert poller.cancel(c)
    poller.fail(c, TransferError("given up"))
    bell.publish_at(1, np.array([3]), np.array([1]), tag=0)
    after = _expect(poller, 2, 0, Strategy.RESIDENT)
    bell.publish_at(2, np.array([4]), np.array([2]), tag=0)
    assert after.wait(timeout=10)
    assert c.transfer is None and words.reached(1) and not poller.cancel(after)


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


def test_a_request_the_lane_did_not_take_gets_a_fence_for_its_mirror_row(setup) -> None:  # type: ignore[no-untyped-def]
    """With an ids mirror the copier may copy a request early, as it is published; a request that will not
    reach it as a task naming its row (given up, another route) gets a task of no blocks naming the row
    once the poller reads it, and the row stays busy until that task has landed."""
    bell, poller, words = setup
    copier = poller._workers[0].resident
    if poller._lane is None:
        pytest.skip("no fast lane (numba)")
    copier.mirror_rows, copier._row_task = 16, np.zeros(16, np.int64)  # as a GPU copier's `read_ids_from`
    given_up = _expect(poller, 1, 0, Strategy.RESIDENT)
    assert poller.cancel(given_up)
    poller.fail(given_up, TransferError("given up"))
    other = _expect(poller, 2, 0, Strategy.ZERO_COPY)
    lane = _expect(poller, 3, 0, Strategy.RESIDENT)
    bell.publish_at(1, np.array([3]), np.array([1]), tag=0)
    bell.publish_at(2, np.array([4]), np.array([2]), tag=0)
    bell.publish_at(3, np.array([5]), np.array([3]), tag=0)
    assert other.wait(timeout=10) and lane.wait(timeout=10)
    fences = copier._row_task[:3].tolist()
    assert fences[0] > 0 and fences[1] > 0 and fences[2] == 0, "the lane's own task names row 2: no fence"
    for task in fences[:2]:
        copier.event(task).synchronize()
    assert copier.mirror_row_busy(17) == 0 and copier.mirror_row_busy(18) == 0
    assert given_up.transfer is None and words.reached(1)
