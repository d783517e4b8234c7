"""Nothing waits forever, on the CPU backend: every way to wait on every strategy, a dead poller, a dead DMA
worker, the watchdog, close under load, and a runtime without numba. (The GPU half of the same contract:
test_device_wait_patterns_gpu.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

import pulseio
from pulseio import ClosedError, PulseError, RuntimeConfig, Strategy, TransferError

SMALL = RuntimeConfig(device="cpu", host_blocks=256, device_slots=64, block_bytes=64, ring_slots=8,
                      max_blocks_per_request=16, spin_iterations=2000)
EVERY = [Strategy.RESIDENT, Strategy.ZERO_COPY, Strategy.GATHER_DMA, Strategy.BATCHED, Strategy.PER_BLOCK,
         Strategy.AUTO]


def _runtime(**changes: Any) -> pulseio.Runtime:
    rt = pulseio.open_runtime(dataclasses.replace(SMALL, **changes))
    rt.host_pool.blocks[:] = torch.arange(256, dtype=torch.uint8)[:, None]  # block b is all b
    return rt


@pytest.mark.parametrize("strategy", EVERY)
def test_every_way_to_wait_works_on_every_strategy(strategy: Strategy) -> None:
    with _runtime() as rt:
        ways = {
            "device_wait": lambda c: c.device_wait(),
            "wait": lambda c: c.wait(timeout=10),
            "done": lambda c: _until(c.done),
            "await": lambda c: asyncio.run(_await(c)),
        }
        for i, (name, wait) in enumerate(ways.items()):
            ids, slots = np.array([10 + i, 20 + i]), np.array([2 * i, 2 * i + 1])
            done = rt.post_recall(host_ids=ids, device_slots=slots, strategy=strategy, tag=i)
            wait(done)
            assert done.done() and done.exception() is None, name
            assert rt.device_pool.slots[2 * i, 0] == 10 + i and rt.device_pool.slots[2 * i + 1, 0] == 20 + i, name
        with pulseio.DmaEngine(rt.host_pool, rt.device_pool) as dma:
            transfer = dma.recall(host_ids=np.array([77]), device_slots=np.array([40]), strategy=strategy)
            transfer.device_wait()  # on the host backend: waits on the host (it hung for launch routes)
            assert transfer.done() and rt.device_pool.slots[40, 0] == 77


async def _await(c: pulseio.Completion) -> None:
    assert (await c) is c


def _until(predicate: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(1e-3)


def test_a_dead_poller_fails_what_it_had_not_served_and_every_later_call() -> None:
    rt = _runtime(strategy=Strategy.GATHER_DMA)
    try:
        assert rt.post_recall(host_ids=np.array([1]), device_slots=np.array([1])).wait(timeout=10)
        real = rt.doorbell.wait_rung
        gate = threading.Event()

        def broken(*args: Any, **kwargs: Any) -> Any:
            gate.wait(10)
            raise RuntimeError("injected: the poller's read failed")

        rt.doorbell.wait_rung = broken  # type: ignore[method-assign]
        time.sleep(0.2)  # the poller's current wait (real) times out; its next call is the broken one
        pending = [rt.post_recall(host_ids=np.array([2 + i]), device_slots=np.array([2 + i])) for i in range(3)]
        gate.set()
        for c in pending:
            with pytest.raises(TransferError, match=r"poller thread died \(RuntimeError\(.injected"):
                c.wait(timeout=10)
        with pytest.raises(PulseError, match=r"^pulseio's poller thread died"):
            rt.post_recall(host_ids=np.array([9]), device_slots=np.array([9]))
        rt.doorbell.wait_rung = real  # type: ignore[method-assign]
    finally:
        rt.close()


def test_a_dead_dma_worker_fails_its_queued_transfers_and_later_submits() -> None:
    with _runtime() as rt:
        dma = pulseio.DmaEngine(rt.host_pool, rt.device_pool)
        gate = threading.Event()

        def broken_issue(batch: Any) -> None:
            gate.wait(10)
            raise RuntimeError("injected: a bug in the worker")

        dma._issuer._issue = broken_issue  # type: ignore[method-assign]
        transfers = [dma.recall(host_ids=np.array([i]), device_slots=np.array([i]), strategy=Strategy.GATHER_DMA)
                     for i in range(3)]
        gate.set()
        for t in transfers:
            with pytest.raises(TransferError):
                t.wait(timeout=10)
        with pytest.raises(ClosedError, match=r"worker thread died \(RuntimeError\(.injected"):
            dma.recall(host_ids=np.array([5]), device_slots=np.array([5]), strategy=Strategy.GATHER_DMA)
        stats = dma.statistics()
        assert stats.submitted == stats.completed + stats.failed


class _HeldPublisher:
    """The host producer, made to behave like a GPU's (device waits are waits on words) and to hold its
    publishes back until `release()`: a publish that never runs, as behind a stuck stream."""

    waits_on_device = True

    def __init__(self, real: Any) -> None:
        self._real, self.held, self.waits = real, [], []

    def post(self, *args: Any) -> None:
        self.held.append(args)

    def release(self) -> None:
        held, self.held = self.held, []
        for args in held:
            self._real.post(*args)

    def check_ids(self, name: str, ids: Any) -> None:
        self._real.check_ids(name, ids)

    def wait_word(self, stream: Any, address: int, value: int) -> None:
        self.waits.append((address, value))

    def drain_sync(self, timeout: float) -> bool:
        return self._real.drain_sync(timeout)

    def close(self) -> None:
        self._real.close()


def _hold_publishes(rt: pulseio.Runtime) -> _HeldPublisher:
    publisher = rt._publisher = rt._waits._publisher = _HeldPublisher(rt._publisher)
    return publisher


def test_the_watchdog_fails_and_releases_a_device_wait_that_cannot_be_met(caplog: pytest.LogCaptureFixture) -> None:
    rt = _runtime(strategy=Strategy.RESIDENT, device_wait_timeout_s=0.2)
    publisher = _hold_publishes(rt)
    try:
        rt.device_pool.slots[3] = 0xEE  # poison: the cancelled request must leave it so
        done = rt.post_recall(host_ids=np.array([7]), device_slots=np.array([3]), tag=4)
        done.device_wait()
        (address, seq), = publisher.waits
        assert address == rt._words.address(done.seq) and not rt._words.reached(seq)
        with pytest.raises(TransferError, match=r"^doorbell request seq=1 tag=4 \(resident\) did not land "
                                                r"within device_wait_timeout_s=0.2 s and never reached a copier"):
            done.wait(timeout=10)
        assert rt._words.reached(seq)  # the stream is let go
        reports = [r.getMessage() for r in caplog.records if r.getMessage().startswith("at the first expired")]
        assert len(reports) == 1 and "--- pulseio-poller" in reports[0] and "--- MainThread" in reports[0]
        # where the request stood: its publish never ran, and its word was still unset
        assert "doorbell slot of seq 1: not published (the slot still holds seq 0)" in reports[0]
        assert "wait words: seq 1: 0" in reports[0]
        publisher.release()  # the publish runs after all: the request must not be copied now
        after = rt.post_recall(host_ids=np.array([8]), device_slots=np.array([4]), tag=5)
        publisher.release()
        assert after.wait(timeout=10) and rt.device_pool.slots[3, 0] == 0xEE and rt.device_pool.slots[4, 0] == 8
        stats = rt.statistics()
        assert (stats.completed, stats.failed, stats.device_waits_expired) == (1, 1, 1)
    finally:
        rt.close()


def test_a_device_wait_has_its_copier_serve_the_word_before_the_stream_waits_on_it() -> None:
    """The copier generation for a device wait is enqueued in the stream's order before the stream's wait:
    enqueued after it, it would start only once the wait it must end was over."""
    rt = _runtime(strategy=Strategy.RESIDENT)
    publisher = _hold_publishes(rt)
    calls: list[tuple] = []
    copier = rt.workers[0].resident
    serve_for = copier.serve_for
    copier.serve_for = lambda stream, word, value: (calls.append(("serve", stream, word, value)),
                                                    serve_for(stream, word, value))
    publisher.wait_word = lambda stream, word, value: calls.append(("wait", stream, word, value))
    try:
        done = rt.post_recall(host_ids=np.array([7]), device_slots=np.array([3]))
        stream = object()
        done.device_wait(stream)
        word = rt._words.address(done.seq)
        assert calls == [("serve", stream, word, done.seq), ("wait", stream, word, done.seq)]
        publisher.release()
        assert done.wait(timeout=10) and rt._words.reached(done.seq)
    finally:
        rt.close()


@pytest.mark.parametrize("strategy", [Strategy.RESIDENT, Strategy.GATHER_DMA])
def test_close_under_load_returns_in_time_and_leaves_nothing_pending(strategy: Strategy) -> None:
    rt = _runtime(strategy=strategy, close_timeout_s=1.0, ring_slots=64, device_wait_timeout_s=0.2)
    publisher = _hold_publishes(rt)
    rng = np.random.default_rng(0)
    posted = [rt.post_recall(host_ids=rng.choice(256, 8, replace=False), device_slots=rng.choice(64, 8, replace=False))
              for _ in range(40)]
    publisher.release()
    # publishes that never run
    never = [rt.post_recall(host_ids=np.array([1]), device_slots=np.array([1])) for _ in range(3)]
    for c in never:
        if strategy is Strategy.RESIDENT:
            c.device_wait()  # a wait on the word: close must release it
        else:  # a launch route's device_wait waits (on the host) for the copy to be enqueued: bounded
            with pytest.raises(TransferError, match=r"was not enqueued within device_wait_timeout_s=0.2 s"):
                c.device_wait()
    start = time.monotonic()
    rt.close()
    assert time.monotonic() - start < 5
    assert all(c.done() for c in posted + never)
    for c in never:  # failed by close, or by the watchdog first
        with pytest.raises((ClosedError, TransferError)):
            c.wait(timeout=0)
    assert all(rt._words.reached(c.seq) for c in posted + never)  # no stream may still wait on a word
    stats = rt.statistics()
    assert stats.submitted == stats.completed + stats.failed == 43


def test_without_numba_the_runtime_works_on_the_slower_path() -> None:
    code = textwrap.dedent("""
        import sys
        class _NoNumba:
            def find_spec(self, name, path=None, target=None):
                if name == "numba" or name.startswith("numba.") or name == "llvmlite" or name.startswith("llvmlite."):
                    raise ImportError("numba is not installed (test)")
        sys.meta_path.insert(0, _NoNumba())
        import numpy as np, pulseio
        from pulseio._native import task_ring
        assert task_ring.forward is None
        cfg = pulseio.RuntimeConfig(device="cpu", host_blocks=64, device_slots=16, block_bytes=64, ring_slots=4)
        with pulseio.open_runtime(cfg) as rt:
            rt.host_pool.blocks[:] = 5
            for strategy in (pulseio.Strategy.AUTO, pulseio.Strategy.RESIDENT, pulseio.Strategy.ZERO_COPY):
                done = rt.post_recall(host_ids=np.array([1, 2]), device_slots=np.array([3, 4]), strategy=strategy)
                done.device_wait()
                assert done.wait(10) and int(rt.device_pool.slots[4, 0]) == 5
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    assert "numba is not installed: the doorbell's fast lane is off" in proc.stderr
