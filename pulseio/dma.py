"""DmaEngine: the one place a TransferPlan becomes copies and kernels. `submit` never waits.

The submitting thread validates a transfer (raising at once on bad input) and, when its route is
only a launch and nothing is queued ahead, issues it right there; otherwise the worker thread
drains the queue, merges queued transfers of one route into one issue (many small recalls, one
DMA), and enqueues their device work. What an issue leaves running goes to `InFlight`, which the
thread that needs a transfer finished works through itself (see `pulseio._inflight`).

Which route wins (the bench measures it on each machine): the copy engine moves large
contiguous buffers at the link's limit without using SMs, but pays ~2 us per copy, so for
scattered blocks it needs a gather into one staging buffer first. A kernel reading pinned memory
through UVA (zero-copy) has no per-copy cost and no staging, which wins for few blocks, but it
occupies SMs the model wants. cuMemcpyBatchAsync hands the driver all copies in one call. For a
small recall the host's cost dominates (a kernel launch alone is 6-8 us on the H200 VM): the
RESIDENT route keeps the zero-copy kernel on the GPU between transfers and posts each transfer into
a pinned task ring, so issuing one is a few stores (`pulseio/_cuda/resident_kernel.py`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from ._inflight import InFlight, Issue
from .config import DmaConfig
from .errors import ClosedError, InvalidRequestError, WaitTimeout, WouldBlock
from .memory import DevicePool, HostPool
from .plan import Direction, IdArray, Strategy, TransferPlan, make_plan
from .transfer import Transfer, TransferState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DmaStatistics:
    """Counters of a DmaEngine since it opened (a snapshot)."""

    submitted: int
    completed: int
    failed: int
    in_flight: int
    bytes_moved: int
    issues: int  # issues that completed: < completed when transfers were merged
    by_strategy: dict[Strategy, int]  # transfers completed per strategy


@dataclass(slots=True)
class _Queued:
    transfer: Transfer
    plan: TransferPlan
    after: Any
    raise_on_landed: tuple[int, int] | None = None
    posted_task: int | None = None


_STOP = object()


class DmaEngine:
    """Moves blocks between a HostPool and a DevicePool of the same backend.

    Bad input raises on `submit`'s thread and queues nothing. A failure while copying (a CUDA error)
    fails the transfers of that one issue -- merged transfers share it -- and the engine goes on.

    Transfers in flight at the same time are not ordered with respect to each other: routes run on
    their own streams, merged transfers are one copy, and the RESIDENT kernel copies consecutive
    tasks at once. So two of them must not write the same host block or device slot, nor may one
    read what another writes (an offload from a slot and a recall into it). Submit the dependent
    transfer once the first has landed: after `wait()`, or with `stream_ordered=True` behind
    `device_wait` on the submitting stream.
    """

    def __init__(self, host: HostPool, device: DevicePool, config: DmaConfig | None = None) -> None:
        if host.backend is not device.backend:
            raise InvalidRequestError("the host pool and the device pool must come from the same backend")
        if host.block_bytes != device.block_bytes:
            raise InvalidRequestError(
                f"host blocks ({host.block_bytes} B) and device slots ({device.block_bytes} B) must be the same size"
            )
        self.host = host
        self.device = device
        self.config = config or DmaConfig()
        self._inflight = InFlight(self._synchronize, self._query, self._resolve)
        self._routes = host.backend.open_routes(host, device, self.config, self._inflight.reclaim)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._issue_lock = threading.Lock()  # one issuer at a time keeps the copy stream in submit order
        self._queued = 0  # submitted to the worker, not yet issued
        self._closed = False
        self._dead: BaseException | None = None  # why the worker thread died, once it has
        self._seq = 0
        self._submitted = self._completed = self._failed = self._bytes = self._issues = 0  # under _lock
        self._by_strategy: dict[Strategy, int] = {}  # keyed by member: .value is a Python call per transfer
        self._worker = threading.Thread(target=self._work, name="pulseio-dma-worker", daemon=True)
        self._worker.start()

    @property
    def available(self) -> frozenset[Strategy]:
        return self._routes.available

    @property
    def raises_on_device(self) -> frozenset[Strategy]:
        """Strategies whose transfers can raise a device word when they land (`submit(raise_on_landed=)`)."""
        return self._routes.raises_on_device

    def bind_thread(self) -> None:
        """Prepare the calling thread for this engine's driver calls (the doorbell's poller does it first)."""
        self._routes.bind_thread()

    @property
    def resident(self) -> Any:
        """The RESIDENT route's copier, or None on a backend without one (the doorbell's fast lane)."""
        return self._routes.resident

    # -- submitting ------------------------------------------------------------------------

    def recall(
        self, *, host_ids: IdArray, device_slots: IdArray, strategy: Strategy = Strategy.AUTO,
        tag: int | None = None, stream_ordered: bool = True, timeout: float | None = None,
    ) -> Transfer:
        """Copy host blocks host_ids[b] into device slots device_slots[b] ([n] integer ids, host).

        Waits (GIL released) only while DmaConfig.max_inflight transfers are in flight, raising WaitTimeout
        after `timeout` s; `recall_nowait` raises WouldBlock instead. stream_ordered: the copy starts only
        after work already enqueued on the caller's current stream (which may still read the slots).
        """
        plan = self._plan(Direction.H2D, host_ids, device_slots)
        return self.submit(plan, strategy=strategy, tag=tag, stream_ordered=stream_ordered, timeout=timeout)

    def recall_nowait(
        self, *, host_ids: IdArray, device_slots: IdArray, strategy: Strategy = Strategy.AUTO,
        tag: int | None = None, stream_ordered: bool = True,
    ) -> Transfer:
        """`recall`, raising WouldBlock rather than waiting for room. Never waits."""
        plan = self._plan(Direction.H2D, host_ids, device_slots)
        return self.submit_nowait(plan, strategy=strategy, tag=tag, stream_ordered=stream_ordered)

    def offload(
        self, *, device_slots: IdArray, host_ids: IdArray, strategy: Strategy = Strategy.AUTO,
        tag: int | None = None, stream_ordered: bool = True, timeout: float | None = None,
    ) -> Transfer:
        """Copy device slots device_slots[b] into host blocks host_ids[b]; waits as `recall` does.

        stream_ordered: the copy reads the slots only after work already enqueued on the caller's
        current stream (which may still be writing them).
        """
        plan = self._plan(Direction.D2H, host_ids, device_slots)
        return self.submit(plan, strategy=strategy, tag=tag, stream_ordered=stream_ordered, timeout=timeout)

    def offload_nowait(
        self, *, device_slots: IdArray, host_ids: IdArray, strategy: Strategy = Strategy.AUTO,
        tag: int | None = None, stream_ordered: bool = True,
    ) -> Transfer:
        """`offload`, raising WouldBlock rather than waiting for room. Never waits."""
        plan = self._plan(Direction.D2H, host_ids, device_slots)
        return self.submit_nowait(plan, strategy=strategy, tag=tag, stream_ordered=stream_ordered)

    def _plan(self, direction: Direction, host_ids: IdArray, device_slots: IdArray) -> TransferPlan:
        return make_plan(
            direction, host_ids, device_slots,
            num_host_blocks=self.host.num_blocks,
            num_device_slots=self.device.num_slots,
            block_bytes=self.host.block_bytes,
        )

    def submit(
        self, plan: TransferPlan, *, strategy: Strategy = Strategy.AUTO, tag: int | None = None,
        stream_ordered: bool = True, timeout: float | None = None,
    ) -> Transfer:
        """Queue a validated plan; waits (GIL released, finishing landed transfers) while max_inflight are
        in flight, WaitTimeout after `timeout` s. Raises ClosedError once closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self.submit_nowait(plan, strategy=strategy, tag=tag, stream_ordered=stream_ordered)
            except WouldBlock as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"no room for a transfer within {timeout} s: {exc}") from exc
                if not self._inflight.reclaim():
                    time.sleep(20e-6)

    def submit_nowait(
        self, plan: TransferPlan, *, strategy: Strategy = Strategy.AUTO, tag: int | None = None,
        stream_ordered: bool = True,
    ) -> Transfer:
        """`submit`, raising WouldBlock past max_inflight. Never waits."""
        return self._submit(plan, strategy=strategy, tag=tag, stream_ordered=stream_ordered)

    def _submit(
        self, plan: TransferPlan, *, strategy: Strategy, tag: int | None, stream_ordered: bool,
        raise_on_landed: tuple[int, int] | None = None, posted_task: int | None = None, launch_here: bool = True,
    ) -> Transfer:
        """Queue a validated plan. Raises WouldBlock past max_inflight, ClosedError once closed.

        A route whose issue is a post (RESIDENT, unordered) is issued on this thread: a few stores, no
        driver call, no lock another issuer holds. launch_here=False: never issue a launch route here
        either (the doorbell's poller, which must never block in a driver call, passes it).

        raise_on_landed: (address of an int64 the copier can store to, value). If the chosen strategy
        is in `raises_on_device`, the copier stores value there once the data has landed, with no
        stream operation and no host thread in between; otherwise it is ignored.
        posted_task: the plan was already posted as this task of `resident` (by the doorbell's fast
        lane, which validated it the same way): the engine only tracks it. Needs Strategy.RESIDENT.
        """
        if posted_task is not None and strategy is not Strategy.RESIDENT:
            raise InvalidRequestError(f"posted_task={posted_task} is a RESIDENT task, the strategy is {strategy}")
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be a pulseio.Strategy, got {strategy!r}")
        if strategy is Strategy.AUTO:
            strategy = self.config.auto.choose(plan.direction, plan.block_bytes, plan.num_blocks)
        if strategy not in self._routes.available:
            raise InvalidRequestError(
                f"strategy {strategy.value} is not available on the {self.host.backend.name} backend; "
                f"available: {sorted(s.value for s in self._routes.available)}"
            )
        after = self._routes.record_after() if stream_ordered else None
        limit = self.config.max_inflight
        if self._submitted - self._completed - self._failed >= limit:  # nobody waited lately: finish what landed
            self._inflight.poll()
        with self._lock:
            if self._dead is not None:
                raise self._dead
            if self._closed:
                raise ClosedError("this DmaEngine is closed")
            in_flight = self._submitted - self._completed - self._failed
            if in_flight >= limit:
                raise WouldBlock(
                    f"{in_flight} transfers in flight, the limit is DmaConfig.max_inflight={self.config.max_inflight}; "
                    "wait for one to finish"
                )
            self._seq += 1
            self._submitted += 1
            transfer = Transfer(
                seq=self._seq, tag=tag, direction=plan.direction, strategy=strategy,
                num_blocks=plan.num_blocks, nbytes=plan.nbytes, inflight=self._inflight,
            )
            item = _Queued(transfer, plan, after, raise_on_landed, posted_task)
            # Issue on this thread when the route is only a launch and nothing is queued ahead:
            # one thread hop less per transfer. Never waits: if the worker is issuing, queue.
            posted = strategy in self._routes.posted and after is None
            inline = posted or (
                launch_here and self.config.inline_issue and strategy in self._routes.inline and self._queued == 0
                and self._issue_lock.acquire(blocking=False)
            )
            if not inline:
                self._queued += 1
                self._queue.put(item)
        if inline:
            try:
                self._issue([item])
            finally:
                if not posted:
                    self._issue_lock.release()
        return transfer

    # -- the worker ------------------------------------------------------------------------

    def _work(self) -> None:
        batch: list[_Queued] = []
        try:
            self._routes.bind_thread()
            carry: _Queued | None = None
            while True:
                first = carry if carry is not None else self._queue.get()
                carry = None
                if first is _STOP:
                    return
                batch, carry = self._drain(first)
                with self._issue_lock:
                    self._issue(batch)
                with self._lock:
                    self._queued -= len(batch)
                batch = []
        except BaseException as exc:  # noqa: BLE001 - a dead worker must fail what it holds, whatever killed it
            self._die(exc, batch + ([carry] if carry is not None else []))

    def _die(self, cause: BaseException, held: list[_Queued]) -> None:
        """The worker thread died: fail the transfers it held or had queued, and every later submit."""
        error = ClosedError(f"this DmaEngine's worker thread died ({cause!r}); close the engine")
        error.__cause__ = cause
        log.error("%s", error, exc_info=cause)
        with self._lock:
            self._dead = error
        while True:
            try:
                held.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for item in held:
            if item is not _STOP and item.transfer.state is TransferState.QUEUED:
                with self._lock:
                    self._failed += 1
                item.transfer._set_failed(error)

    def _drain(self, first: _Queued) -> tuple[list[_Queued], Any]:
        """Merge queued transfers of the same route behind `first`, up to merge_blocks blocks."""
        batch, blocks = [first], first.plan.num_blocks
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, None
            same_route = (
                item is not _STOP
                and item.transfer.strategy is first.transfer.strategy
                and item.plan.direction is first.plan.direction
                and item.posted_task is None and first.posted_task is None  # posted already: one task each
            )
            if not same_route or blocks + item.plan.num_blocks > self.config.merge_blocks:
                return batch, item
            batch.append(item)
            blocks += item.plan.num_blocks

    def _issue(self, batch: list[_Queued]) -> None:
        first = batch[0]
        strategy = first.transfer.strategy
        issue = Issue(batch)
        if len(batch) == 1:  # the common case (every inline issue): nothing to merge
            plans = [first.plan]
            after = [first.after] if first.after is not None else []
            raise_on_landed = first.raise_on_landed
        else:
            plans, after = [q.plan for q in batch], [q.after for q in batch if q.after is not None]
            raises = [q.raise_on_landed for q in batch if q.raise_on_landed is not None]
            raise_on_landed = max(raises, key=lambda r: r[1]) if raises else None  # all land before the last piece
        try:
            self._routes.issue(
                strategy, plans, after, lambda pending: self._inflight.piece(issue, pending), raise_on_landed,
                first.posted_task,
            )
        except Exception as exc:  # a route failure fails these transfers; the engine keeps serving
            log.debug("issue of %d transfers failed", len(batch), exc_info=True)
            issue.error = exc
        else:
            for q in batch:
                q.transfer._set_issued(issue.device_event)
        self._inflight.marker(issue)  # after every piece: resolve the batch

    # -- finishing (on whichever thread works through InFlight) ----------------------------

    def _synchronize(self, event: Any) -> None:
        self._routes.synchronize(event)

    def _query(self, event: Any) -> bool:
        return self._routes.query(event)

    def _resolve(self, issue: Issue) -> None:
        batch, error = issue.batch, issue.error
        with self._lock:
            if error is None:
                strategy = batch[0].transfer.strategy
                self._completed += len(batch)
                self._bytes += batch[0].plan.nbytes if len(batch) == 1 else sum(q.plan.nbytes for q in batch)
                self._issues += 1
                self._by_strategy[strategy] = self._by_strategy.get(strategy, 0) + len(batch)
            else:
                self._failed += len(batch)
        for q in batch:
            if error is None:
                q.transfer._set_done()
            else:
                q.transfer._set_failed(error)

    # -- lifecycle -------------------------------------------------------------------------

    def statistics(self) -> DmaStatistics:
        self._inflight.poll()
        with self._lock:
            return DmaStatistics(
                submitted=self._submitted, completed=self._completed, failed=self._failed,
                in_flight=self._submitted - self._completed - self._failed, bytes_moved=self._bytes,
                issues=self._issues, by_strategy=dict(self._by_strategy),
            )

    def close(self) -> None:
        """Finish every submitted transfer, stop the threads and release the routes' buffers."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(_STOP)
        self._worker.join()
        self._inflight.stop()
        self._routes.close()

    def __enter__(self) -> DmaEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

