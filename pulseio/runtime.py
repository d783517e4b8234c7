"""Runtime: the composition root of the recall path, and its lifecycle.

It owns the pools, the I/O workers (`DmaEngine`s), the doorbell ring, the ring's producer side
(the publish kernel on CUDA; a CPU thread on the host backend), the poller thread, the device
completion word and one interrupt pump per event loop.

    with pulseio.open_runtime(pulseio.RuntimeConfig(device="cuda")) as rt:
        ids = pick_blocks(scores)                      # [k] int64, cuda: chosen by a GPU kernel
        done = rt.post_recall(ids, slots)              # enqueues the publish kernel; no host sync
        done.device_wait()                             # the consumer stream waits on the GPU
        ...                                            # or: done.wait(), done.done(), `await done`

Closing waits until every posted request was read, every copy landed and the device can no longer
write the ring or wait on the completion word (a device sync: close is not on the hot path).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from .backend import Backend
from .config import RuntimeConfig
from .devices import open_backend
from .dma import DmaEngine, DmaStatistics
from .doorbell import Doorbell, DoorbellStatistics, RingLayout
from .errors import ClosedError, InvalidRequestError, WouldBlock
from .host_producer import HostProducer
from .interrupts import Completion, InterruptPump
from .memory import DevicePool, HostPool
from .plan import Direction, Strategy, make_plan
from .poller import LatencySummary, Poller

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeStatistics:
    """Counters and latencies of a Runtime since it opened (a snapshot)."""

    submitted: int  # requests posted, expected, or recalled directly
    completed: int
    failed: int
    in_flight: int
    bytes_moved: int
    poll_wakeups: int  # poller waits that ended with requests
    spurious_wakeups: int  # poller waits that timed out with none
    lost: int  # requests overwritten in the ring before the poller read them (0 unless misused)
    loop_wakeups: int  # call_soon_threadsafe calls made by the interrupt pumps
    post_to_seen: LatencySummary
    post_to_landed: LatencySummary
    doorbell: DoorbellStatistics
    dma: tuple[DmaStatistics, ...]


class Runtime:
    """Pools, I/O workers, doorbell, poller and completions; see the module docstring."""

    def __init__(self, config: RuntimeConfig | None = None, *, backend: Backend | None = None) -> None:
        self.config = config = config or RuntimeConfig()
        self.backend = backend or open_backend(config.device)
        self._lock = threading.Lock()
        self._ticket = 0  # seqs handed out: the device counter reaches it once every publish ran
        self._direct = 0
        self._closed = False
        self._pumps: dict[Any, InterruptPump] = {}
        self._parts: list[Any] = []  # built so far, closed in reverse if construction fails
        try:
            self.host_pool = self._part(HostPool(self.backend, config.host_blocks, config.block_bytes))
            self.device_pool = DevicePool(self.backend, config.device_slots, config.block_bytes)
            self.workers = tuple(self._part(DmaEngine(self.host_pool, self.device_pool, config.dma))
                                 for _ in range(config.io_workers))
            layout = RingLayout(config.ring_slots, config.max_blocks_per_request)
            memory = self.backend.alloc_host(layout.nbytes, label="doorbell ring")
            self.doorbell = self._part(Doorbell(memory, layout, spin_iterations=config.spin_iterations,
                                                sleep_s=config.poll_sleep_s))
            self._publisher = self._part(self._open_publisher(layout))
            self._poller = Poller(self.doorbell, self.workers, self._publisher, plan=self._plan,
                                  latency_samples=config.latency_samples)
        except BaseException:
            for part in reversed(self._parts):
                part.close()
            raise

    def _part(self, part: Any) -> Any:
        self._parts.append(part)
        return part

    def _open_publisher(self, layout: RingLayout) -> Any:
        if self.backend.name != "cuda":
            return HostProducer(self.doorbell)
        from ._cuda.doorbell_kernels import DevicePublisher

        return DevicePublisher(self.backend.device, getattr(self.backend, "context", None), self.doorbell.device_ptr,
                               layout.capacity, layout.slot_words)

    def _plan(self, host_ids: Any, device_slots: Any) -> Any:
        return make_plan(Direction.H2D, host_ids, device_slots, num_host_blocks=self.host_pool.num_blocks,
                         num_device_slots=self.device_pool.num_slots, block_bytes=self.host_pool.block_bytes)

    # -- posting (the submitting thread: never waits on the GPU) -----------------------------------

    def post_recall_nowait(self, block_ids: Any, device_slots: Any, *, count: Any = None, tag: int = 0,
                           stream: Any = None, strategy: Strategy | None = None) -> Completion:
        """Recall host blocks block_ids[b] into device slots device_slots[b], b < count, ids decided on
        the device: enqueues the publish kernel on `stream` (default: current) and returns at once.

        block_ids, device_slots: [>= count] int64, on the runtime's device (host on the CPU backend).
        count: int, or a [1] int64 device tensor written by the selecting kernel, or None (all ids).
        tag: an int the request carries (errors name it). Raises WouldBlock when ring_slots requests
        are posted and not yet read (a further publish could overwrite one).
        """
        count = self._check_post(block_ids, device_slots, count, tag)
        strategy = self._strategy(strategy)
        with self._lock:
            self._admit(1)
            completion = self._completion(self._ticket + 1, tag)
            self._poller.expect(completion, strategy)
            try:
                self._publisher.post(block_ids, device_slots, count, tag, stream)
            except BaseException:
                self._poller.forget(completion.seq)
                raise
            self._ticket += 1
        return completion

    def post_recall(self, block_ids: Any, device_slots: Any, *, count: Any = None, tag: int = 0,
                    stream: Any = None, strategy: Strategy | None = None, timeout: float | None = None
                    ) -> Completion:
        """`post_recall_nowait`, waiting (for the poller, GIL released) while the ring is full; raises
        WouldBlock after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self.post_recall_nowait(block_ids, device_slots, count=count, tag=tag, stream=stream,
                                               strategy=strategy)
            except WouldBlock:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                time.sleep(20e-6)

    def expect_published(self, n: int = 1, *, strategy: Strategy | None = None) -> list[Completion]:
        """Completions for the next n requests that a kernel of yours publishes itself (calling
        `publish_device`, or replaying a captured CUDA graph), in publish order. Raises WouldBlock
        when the ring could not hold them."""
        strategy = self._strategy(strategy)
        with self._lock:
            self._admit(n)
            completions = [self._completion(self._ticket + 1 + i, None) for i in range(n)]
            for completion in completions:
                self._poller.expect(completion, strategy)
            self._ticket += n
        return completions

    def wait_ring_space(self, n: int = 1, *, timeout: float | None = None) -> None:
        """Wait until n more requests can be posted; raises WouldBlock on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._ticket + n - (self.doorbell.next_seq - 1) > self.config.ring_slots:
            if self._closed:
                raise ClosedError("this Runtime is closed")
            if deadline is not None and time.monotonic() >= deadline:
                self._admit(n)
            time.sleep(20e-6)

    def recall(self, host_ids: Any, device_slots: Any, *, tag: Any = None, strategy: Strategy | None = None,
               stream_ordered: bool = True) -> Completion:
        """Recall with ids already on the host ([n] integer ids): straight to an I/O worker, no ring."""
        with self._lock:
            self._check_open()
            self._direct += 1
            worker = self.workers[self._direct % len(self.workers)]
        transfer = worker.recall(host_ids, device_slots, strategy=self._strategy(strategy), tag=tag,
                                 stream_ordered=stream_ordered)
        completion = Completion(seq=0, tag=tag, device_waiter=lambda c, s: c.transfer.device_wait(s),
                                awaiter=self._future)
        completion.transfer, completion.num_blocks, completion.nbytes = transfer, transfer.num_blocks, transfer.nbytes
        self._poller.track(completion, transfer)
        return completion

    def _check_post(self, ids: Any, slots: Any, count: Any, tag: Any) -> Any:
        if not isinstance(tag, int):
            raise TypeError(f"tag must be an int (the ring stores int64), got {tag!r}")
        length = min(len(ids), len(slots))
        if self.backend.name == "cuda":
            for name, t in (("block_ids", ids), ("device_slots", slots)):
                if not (t.is_cuda and str(t.dtype) == "torch.int64" and t.is_contiguous()):
                    raise InvalidRequestError(f"{name} must be a contiguous int64 CUDA tensor, got {t.dtype} "
                                              f"on {t.device}")
        if count is None:
            return length
        if isinstance(count, int) and not 0 <= count <= min(length, self.config.max_blocks_per_request):
            raise InvalidRequestError(
                f"count={count} must be within 0..{min(length, self.config.max_blocks_per_request)} "
                f"(the ids given and RuntimeConfig.max_blocks_per_request)")
        return count

    def _strategy(self, strategy: Strategy | None) -> Strategy:
        return self.config.strategy if strategy is None else strategy

    def _admit(self, n: int) -> None:
        self._check_open()
        outstanding = self._ticket - (self.doorbell.next_seq - 1)
        if outstanding + n > self.config.ring_slots:
            raise WouldBlock(f"{outstanding} requests are posted and not yet read by the poller and the ring "
                             f"holds RuntimeConfig.ring_slots={self.config.ring_slots}: {n} more could overwrite "
                             "one; wait (post_recall, wait_ring_space) or make the ring larger")

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this Runtime is closed")

    # -- completions -------------------------------------------------------------------------------

    def _completion(self, seq: int, tag: int | None) -> Completion:
        return Completion(seq=seq, tag=tag, device_waiter=self._device_wait, awaiter=self._future)

    def _device_wait(self, completion: Completion, stream: Any) -> None:
        if self.backend.name != "cuda":
            completion.wait()
        elif self._publisher.stream_ops:
            self._publisher.wait(stream, completion.seq)
        else:  # no stream memory ops: wait on the host until the copy is enqueued, then on its event
            while completion.transfer is None and not completion.done():
                time.sleep(10e-6)
            if completion.transfer is not None:
                completion.transfer.device_wait(stream)

    def _future(self, completion: Completion) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        with self._lock:
            pump = self._pumps.get(loop)
            if pump is None:
                pump = self._pumps[loop] = InterruptPump(loop.call_soon_threadsafe)
        future = loop.create_future()
        pump.watch(completion, lambda c: _settle(future, c))
        return future

    # -- statistics and lifecycle ------------------------------------------------------------------

    def statistics(self) -> RuntimeStatistics:
        poller, ring = self._poller.statistics(), self.doorbell.statistics()
        submitted = self._ticket + self._direct
        with self._lock:
            loop_wakeups = sum(p.statistics().loop_wakeups for p in self._pumps.values())
        return RuntimeStatistics(
            submitted=submitted, completed=poller.completed, failed=poller.failed,
            in_flight=submitted - poller.completed - poller.failed, bytes_moved=poller.bytes_moved,
            poll_wakeups=ring.wakeups, spurious_wakeups=ring.spurious_wakeups, lost=ring.lost,
            loop_wakeups=loop_wakeups, post_to_seen=poller.post_to_seen, post_to_landed=poller.post_to_landed,
            doorbell=ring, dma=tuple(w.statistics() for w in self.workers))

    def close(self) -> None:
        """Finish every posted request, stop the threads and free the ring and pools (see module doc)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not self._wait_read(self.config.close_timeout_s):
            log.warning("closing: requests up to seq %d were posted but the device has not published them "
                        "after %.1f s; releasing device waiters and waiting for the device", self._ticket,
                        self.config.close_timeout_s)
            self._publisher.release_all()
            self._publisher.drain_sync()
            self._wait_read(1.0)
        self._poller.stop()
        for worker in self.workers:
            worker.close()
        self._poller.fail_pending(ClosedError("the runtime closed before this request was published"))
        self._publisher.release_all()  # no stream may wait forever on the completion word
        self._publisher.drain_sync()  # from here on the device writes none of our buffers
        for part in reversed(self._parts):
            if not isinstance(part, DmaEngine):
                part.close()

    def _wait_read(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.doorbell.next_seq <= self._ticket:
            if time.monotonic() >= deadline:
                return False
            time.sleep(1e-3)
        return True

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)


def _settle(future: asyncio.Future[Any], completion: Completion) -> None:
    if future.done():  # the await was cancelled; the request itself runs on
        return
    error = completion.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(completion)


def open_runtime(config: RuntimeConfig | None = None, *, backend: Backend | None = None) -> Runtime:
    """Build a Runtime: use it as `with open_runtime(cfg) as rt:` or `async with open_runtime(cfg) as rt:`."""
    runtime = Runtime(config, backend=backend)
    if runtime.host_pool.backend.device.type == "cuda" and os.environ.get("CUDA_MODULE_LOADING") != "EAGER":
        # Seen on the H200 (2026-11-29): a consumer stream waiting on the completion word, then a
        # kernel launched for the first time, hung every launch in the process -- under lazy module
        # loading a first launch waits for the device, and the device waits for our copy.
        log.warning(
            "CUDA_MODULE_LOADING=%s: with device-side waits (Completion.device_wait) a kernel launched for "
            "the first time can deadlock under lazy loading; set CUDA_MODULE_LOADING=EAGER before CUDA starts",
            os.environ.get("CUDA_MODULE_LOADING", "<unset, torch sets LAZY>"),
        )
    return runtime
