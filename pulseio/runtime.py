"""Runtime: the composition root of the recall path, and its lifecycle.

It owns the pools, the I/O workers (`DmaEngine`s), the doorbell ring, the ring's producer side
(the publish kernel on CUDA; a CPU thread on the host backend), the poller thread, the requests'
wait words and the watchdog, and one interrupt pump per event loop.

    with pulseio.open_runtime(pulseio.RuntimeConfig(device="cuda")) as rt:
        ids = pick_blocks(scores)                      # [k] int64, cuda: chosen by a GPU kernel
        done = rt.post_recall(ids, slots)              # enqueues the publish kernel; no host sync
        done.device_wait()                             # the consumer stream waits on the GPU
        ...                                            # or: done.wait(), done.done(), `await done`

The device-wait contract (what `Completion.device_wait` guarantees, and the watchdog) is in
`pulseio/_device_waits.py`.

Closing fails the requests whose publishes have not run within `close_timeout_s`, lets the copies in
flight land, sets every wait word (no stream waits on us any longer), and frees the ring and the
words only once the device has drained; if it does not drain in time, they are left allocated.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from ._device_waits import DeviceWaits
from ._devices import open_backend
from ._native.task_ring import MAX_MIRROR_ROWS
from ._poller import LatencySummary, Poller
from ._wait_words import WaitWords
from .backend import Backend
from .config import RuntimeConfig
from .dma import DmaEngine, DmaStatistics
from .doorbell import Doorbell, DoorbellStatistics, RingLayout
from .errors import ClosedError, InvalidRequestError, WaitTimeout, WouldBlock
from .handle import settle
from .interrupts import Completion, InterruptPump
from .memory import DevicePool, HostPool
from .plan import Direction, IdArray, Strategy, make_plan
from .recall_graph import RecallGraph, check_capturable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeStatistics:
    """Counters and latencies of a Runtime since it opened (a snapshot)."""

    submitted: int  # requests posted, expected, or recalled directly
    completed: int
    failed: int
    in_flight: int
    bytes_moved: int
    loop_wakeups: int  # call_soon_threadsafe calls made by the interrupt pumps
    device_waits_expired: int  # requests the watchdog failed to release a waiting stream
    post_to_seen: LatencySummary
    post_to_landed: LatencySummary
    publish_to_taken: LatencySummary  # on the device clock: publish began -> the copier began it (RESIDENT)
    publish_to_landed: LatencySummary  # on the device clock: publish began -> data landed (RESIDENT requests)
    publish_to_early_landed: LatencySummary  # on the device clock: publish began -> landed early, before its task
                                             # (RESIDENT requests every copy CTA copied from the ids mirror)
    copy_per_mib: LatencySummary  # on the device clock: the copier began it -> landed, per MiB moved (RESIDENT):
                                  # a spread here is the copy's pace varying, not the requests' sizes
    doorbell: DoorbellStatistics  # the ring: wake-ups, spurious wake-ups, requests lost to a lap
    dma: tuple[DmaStatistics, ...]  # one per I/O worker
    stamped_bytes: int = 0  # RESIDENT requests landed since the open, with both device stamps: their bytes and
    stamped_publish_to_landed_s: float = 0.0  # their publish -> landed summed (device clock), over every one
    stamped_requests: int = 0  # how many of those requests landed since the open, and
    landed_early: int = 0  # of them, those every copy CTA copied from the ids mirror before its task came

    @property
    def publish_to_landed_gbps(self) -> float | None:
        """The rate a RESIDENT request lands at, publish to landed, over every one since the open (GB/s); None
        before the first."""
        if not self.stamped_publish_to_landed_s:
            return None
        return self.stamped_bytes / self.stamped_publish_to_landed_s / 1e9


class Runtime:
    """The recall path for ids chosen on the GPU: a host pool and a device pool of `config.block_bytes` blocks,
    I/O workers (`DmaEngine`s), the doorbell ring a publish kernel writes ids into, the poller thread that
    reads it, and the completions.

        with pulseio.open_runtime(pulseio.RuntimeConfig(device="cuda", host_blocks=..., device_slots=...)) as rt:
            done = rt.post_recall(host_ids=ids, device_slots=slots, count=count)   # [N] int64 GPU tensors; no sync
            done.device_wait()                 # later kernels on the stream see the blocks; the host never waits
            done.wait()                        # or `await done`, `done.done()`: a Completion is a Handle

    - `host_pool`, `device_pool`: the pools (`HostPool`, `DevicePool`); fill the host pool, read the slots.
    - `post_recall` / `post_recall_nowait` (raises `WouldBlock` when the ring or the outstanding requests are
      full) / `post_recall_async`: ids decided on the device, published by a kernel on the stream.
    - `recall`: ids already on the host, straight to an I/O worker. `recall_graph()`: recalls captured into a
      CUDA graph with their device waits (`RecallGraph`).
    - `statistics()`, `close()` (or `with` / `async with`). Transfer settings, an `AutoPolicy` among them, go in
      `RuntimeConfig(dma=DmaConfig(...))`. The device-wait contract: `docs/DESIGN.md`.
    """

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
            words = self.backend.alloc_host(8 * config.max_outstanding, label="wait words")
            self._words = self._part(WaitWords(words, config.max_outstanding))
            copier = self.workers[0].resident if len(self.workers) == 1 else None
            rows = _ids_mirror_rows(config, copier)
            self._publisher = self._part(self.backend.open_publisher(self.doorbell, ids_mirror_rows=rows))
            self._mirror_reader = copier if copier is not None and rows else None  # whose task reads a row
            if self._mirror_reader is not None:
                self._mirror_reader.read_ids_from(self._publisher.ids_mirror, self._publisher.mirror_heads)
            self._resident = all(w.resident is not None for w in self.workers)
            self._poller = Poller(self.doorbell, self.workers, self._words, plan=self._plan,
                                  latency_samples=config.latency_samples)
            self._waits = DeviceWaits(self._publisher, self._words, self._poller, self.workers,
                                      timeout_s=config.device_wait_timeout_s)
        except BaseException:
            for part in reversed(self._parts):
                part.close()
            raise

    def _part(self, part: Any) -> Any:
        self._parts.append(part)
        return part

    def _plan(self, host_ids: Any, device_slots: Any) -> Any:
        return make_plan(Direction.H2D, host_ids, device_slots, num_host_blocks=self.host_pool.num_blocks,
                         num_device_slots=self.device_pool.num_slots, block_bytes=self.host_pool.block_bytes)

    # -- posting (the submitting thread: never waits on the GPU) -----------------------------------

    def post_recall_nowait(self, *, host_ids: Any, device_slots: Any, count: Any = None, tag: int = 0,
                           stream: Any = None, strategy: Strategy | None = None) -> Completion:
        """Recall host blocks host_ids[b] into device slots device_slots[b], b < count, ids decided on the
        device: enqueues the publish kernel on `stream` (default: current) and returns at once.

        host_ids, device_slots: [>= count] int64, on the runtime's device (host on the CPU backend).
        count: int, or a [1] int64 device tensor written by the selecting kernel, or None (all ids).
        tag: an int the request carries (errors name it). Raises WouldBlock when ring_slots requests
        are posted and not yet read (a further publish could overwrite one), or max_outstanding are
        posted and not yet finished.
        """
        count = self._check_post(host_ids, device_slots, count, tag)
        strategy = self._strategy(strategy)
        with self._lock:
            self._admit(1)
            completion = self._completion(self._ticket + 1, tag, strategy)
            self._poller.expect(completion)
            try:
                self._publisher.post(host_ids, device_slots, count, tag, stream)
            except BaseException:
                self._poller.forget(completion.seq)
                raise
            self._ticket += 1
        return completion

    def post_recall(self, *, host_ids: Any, device_slots: Any, count: Any = None, tag: int = 0,
                    stream: Any = None, strategy: Strategy | None = None, timeout: float | None = None
                    ) -> Completion:
        """`post_recall_nowait`, waiting (GIL released) while the ring or the outstanding requests are
        full; raises WaitTimeout after `timeout` seconds. In a coroutine use `post_recall_async`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self.post_recall_nowait(host_ids=host_ids, device_slots=device_slots, count=count, tag=tag,
                                               stream=stream, strategy=strategy)
            except WouldBlock as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"no room to post within {timeout} s: {exc}") from exc
                time.sleep(20e-6)

    async def post_recall_async(self, *, host_ids: Any, device_slots: Any, count: Any = None, tag: int = 0,
                                stream: Any = None, strategy: Strategy | None = None,
                                timeout: float | None = None) -> Completion:
        """`post_recall` for a coroutine: while there is no room it yields to the event loop, not blocks it."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            try:
                return self.post_recall_nowait(host_ids=host_ids, device_slots=device_slots, count=count, tag=tag,
                                               stream=stream, strategy=strategy)
            except WouldBlock as exc:
                if deadline is not None and loop.time() >= deadline:
                    raise WaitTimeout(f"no room to post within {timeout} s: {exc}") from exc
                await asyncio.sleep(50e-6)

    def expect_published(self, n: int = 1, *, strategy: Strategy | None = None) -> list[Completion]:
        """Completions for the next n requests that a kernel of yours publishes itself (calling
        `publish_device`, or replaying a captured CUDA graph), in publish order. Raises WouldBlock
        when the ring could not hold them."""
        strategy = self._strategy(strategy)
        with self._lock:
            self._admit(n)
            completions = [self._completion(self._ticket + 1 + i, None, strategy) for i in range(n)]
            self._poller.expect(*completions)
            self._ticket += n
        return completions

    def recall_graph(self) -> RecallGraph:
        """A RecallGraph: recalls captured into a CUDA graph with their device waits (pulseio/recall_graph.py).
        Needs the CUDA backend and a resident copier on every I/O worker (ConfigError otherwise)."""
        check_capturable(self)
        import torch

        return RecallGraph(self, torch)

    def _post_captured(self, host_ids: Any, device_slots: Any, count: Any, tag: int, stream: Any, seq_out: Any,
                       *, wait: bool = True) -> None:
        """Capture a publish (seq from the device counter, stored in seq_out) and (`wait`) its device wait on
        `stream`."""
        count = self._check_post(host_ids, device_slots, count, tag)
        with self._lock:
            self._check_open()
            self._publisher.post(host_ids, device_slots, count, tag, stream, seq_out=seq_out)
        if wait:
            self._wait_captured(seq_out, stream)

    def _wait_captured(self, seq_out: Any, stream: Any) -> None:
        """The device wait of a captured publish that stored its seq in seq_out, on `stream` (capturing or not)."""
        self._check_open()
        self._publisher.wait_seq(stream, seq_out.data_ptr(), self._words.base, self._words.slots)

    def _arm_replay(self, tags: list[int], stream: Any) -> list[Completion]:
        """Completions for the requests a RecallGraph's replay publishes, served and watched (see recall_graph)."""
        with self._lock:
            self._admit(len(tags))
            completions = [self._completion(self._ticket + 1 + i, tag, Strategy.RESIDENT) for i, tag in enumerate(tags)]
            self._poller.expect(*completions)
            self._ticket += len(tags)
        self._waits.serve_replay(completions, stream)
        return completions

    def wait_ring_space(self, n: int = 1, *, timeout: float | None = None) -> None:
        """Wait until n more requests can be posted (before `expect_published`); WaitTimeout on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                with self._lock:
                    self._admit(n)
                return
            except WouldBlock as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"no room for {n} requests within {timeout} s: {exc}") from exc
            time.sleep(20e-6)

    def recall(self, *, host_ids: IdArray, device_slots: IdArray, tag: int | None = None,
               strategy: Strategy | None = None, stream_ordered: bool = True,
               timeout: float | None = None) -> Completion:
        """Recall with ids already on the host ([n] integer ids): straight to an I/O worker, no ring. Waits
        as `DmaEngine.recall` does (only for room among the transfers in flight)."""
        with self._lock:
            self._check_open()
            self._direct += 1
            worker = self.workers[self._direct % len(self.workers)]
        transfer = worker.recall(host_ids=host_ids, device_slots=device_slots, tag=tag, stream_ordered=stream_ordered,
                                 strategy=strategy or self.config.strategy, timeout=timeout)
        completion = Completion(seq=0, tag=tag, device_waiter=lambda c, s: c.transfer.device_wait(s),
                                awaiter=self._future, strategy=transfer.strategy)
        completion.transfer, completion.num_blocks, completion.nbytes = transfer, transfer.num_blocks, transfer.nbytes
        self._poller.track(completion, transfer)
        return completion

    def _check_post(self, ids: Any, slots: Any, count: Any, tag: Any) -> Any:
        if not isinstance(tag, int):
            raise TypeError(f"tag must be an int (the ring stores int64), got {tag!r}")
        length = min(len(ids), len(slots))
        self._publisher.check_ids("host_ids", ids)
        self._publisher.check_ids("device_slots", slots)
        if count is None:
            return length
        if isinstance(count, int) and not 0 <= count <= min(length, self.config.max_blocks_per_request):
            raise InvalidRequestError(
                f"count={count} must be within 0..{min(length, self.config.max_blocks_per_request)} "
                f"(the ids given and RuntimeConfig.max_blocks_per_request)")
        return count

    def _strategy(self, strategy: Strategy | None) -> Strategy:
        """A doorbell request's strategy: AUTO is RESIDENT wherever there is a resident copier, the one
        route that lands a request with no driver call after its publish (see the module doc)."""
        strategy = self.config.strategy if strategy is None else strategy
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be a pulseio.Strategy, got {strategy!r}")
        return Strategy.RESIDENT if strategy is Strategy.AUTO and self._resident else strategy

    def _admit(self, n: int) -> None:
        """With self._lock held: may n more requests be posted?"""
        self._check_open()
        outstanding = self._ticket - (self.doorbell.next_seq - 1)
        if outstanding + n > self.config.ring_slots:
            raise WouldBlock(f"{outstanding} requests are posted and not yet read by the poller and the ring "
                             f"holds RuntimeConfig.ring_slots={self.config.ring_slots}: {n} more could overwrite "
                             "one; wait (post_recall, wait_ring_space) or make the ring larger")
        slots = self.config.max_outstanding
        for seq in range(max(self._ticket + 1, slots + 1), self._ticket + n + 1):
            if not self._words.reached(seq - slots):
                raise WouldBlock(f"request seq={seq - slots} has not finished and RuntimeConfig.max_outstanding="
                                 f"{slots} requests may be outstanding; wait for it or raise the limit")
            task = self._mirror_reader.mirror_row_busy(seq) if self._mirror_reader is not None else 0
            if task:
                raise WouldBlock(f"request seq={seq - slots} was given up before it landed and its copy (resident "
                                 f"task {task}) may still read its ids in the device mirror row that request "
                                 f"seq={seq} would overwrite; wait until that copy lands")

    def _check_open(self) -> None:
        if self._poller.error is not None:
            raise self._poller.error
        if self._closed:
            raise ClosedError("this Runtime is closed")

    # -- completions -------------------------------------------------------------------------------

    def _completion(self, seq: int, tag: int | None, strategy: Strategy) -> Completion:
        return Completion(seq=seq, tag=tag, device_waiter=self._waits.device_wait, awaiter=self._future,
                          strategy=strategy)

    def _future(self, completion: Completion) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        with self._lock:
            pump = self._pumps.get(loop)
            if pump is None:
                pump = self._pumps[loop] = InterruptPump(loop.call_soon_threadsafe)
        future = loop.create_future()
        pump.watch(completion, lambda c: settle(future, c))
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
            loop_wakeups=loop_wakeups, device_waits_expired=self._waits.expired,
            post_to_seen=poller.post_to_seen, post_to_landed=poller.post_to_landed,
            publish_to_taken=poller.publish_to_taken, publish_to_landed=poller.publish_to_landed,
            publish_to_early_landed=poller.publish_to_early_landed, copy_per_mib=poller.copy_per_mib,
            doorbell=ring, dma=tuple(w.statistics() for w in self.workers), stamped_bytes=poller.stamped_bytes,
            stamped_publish_to_landed_s=poller.stamped_publish_to_landed_s, stamped_requests=poller.stamped_requests,
            landed_early=poller.landed_early)

    def close(self) -> None:
        """Finish or fail every request, release every waiting stream, stop the threads, free what the
        device can no longer touch (see the module doc). Returns within about close_timeout_s."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + self.config.close_timeout_s
        if not self._wait_read(deadline):
            log.warning("closing: requests up to seq %d were posted but the device has not published them "
                        "within close_timeout_s=%.1f s; failing them", self._ticket, self.config.close_timeout_s)
        self._poller.stop()
        self._poller.fail_pending(ClosedError("the runtime closed before this request was published"))
        for worker in self.workers:
            worker.close()  # lets the copies in flight land
        self._words.release_all()  # no stream waits on us any longer
        self._waits.close()
        drained = self._publisher.drain_sync(max(deadline - time.monotonic(), 0.1))
        for part in reversed(self._parts):
            if isinstance(part, DmaEngine):
                continue
            if not drained and isinstance(part, (Doorbell, WaitWords)):
                log.error("closing: the device has not drained within close_timeout_s; leaving the doorbell "
                          "ring and the wait words allocated, since unpublished requests may still write the "
                          "ring and streams may still read the words")
                continue
            part.close()

    def _wait_read(self, deadline: float) -> bool:
        while self.doorbell.next_seq <= self._ticket and self._poller.error is None:
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


IDS_MIRROR_MAX_BYTES = 64 << 20  # device memory the ids mirror may take


def _ids_mirror_rows(config: RuntimeConfig, copier: Any) -> int:
    """Rows of the device mirror of doorbell ids that the fast lane's copier reads (0: none): one per
    wait word, so a row is written again only once its request has finished (`_admit`)."""
    if copier is None or not copier.reads_ids_mirror:
        return 0
    rows, nbytes = config.max_outstanding, config.max_outstanding * 2 * config.max_blocks_per_request * 8
    if rows > MAX_MIRROR_ROWS or nbytes > IDS_MIRROR_MAX_BYTES:
        log.warning("no device mirror of doorbell ids (RuntimeConfig.max_outstanding=%d rows of %d blocks: %d MiB; "
                    "at most %d rows, %d MiB): the resident copier reads each request's ids over PCIe, one round "
                    "trip more per recall", rows, config.max_blocks_per_request, nbytes >> 20, MAX_MIRROR_ROWS,
                    IDS_MIRROR_MAX_BYTES >> 20)
        return 0
    return rows


def open_runtime(config: RuntimeConfig | None = None, *, backend: Backend | None = None) -> Runtime:
    """Build a Runtime: use it as `with open_runtime(cfg) as rt:` or `async with open_runtime(cfg) as rt:`."""
    return Runtime(config, backend=backend)
