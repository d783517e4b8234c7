"""DmaEngine: the one place a TransferPlan becomes copies and kernels.

The submitting thread validates a transfer (raising at once on bad input) and hands it to the issuer
(`pulseio._issuer`: issued right there when its route allows, else by the worker thread, which merges
queued transfers of one route into one issue). What an issue leaves running goes to `InFlight`, which
the thread that needs a transfer finished works through itself (see `pulseio._inflight`).

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
import threading
import time
from dataclasses import dataclass
from typing import Any

from ._inflight import InFlight, Issue
from ._issuer import Issuer, Queued
from ._native import validate
from .config import DmaConfig
from .errors import ClosedError, InvalidRequestError, WaitTimeout, WouldBlock
from .memory import DevicePool, HostPool
from .plan import Direction, IdArray, Strategy, TransferPlan, make_plan
from .transfer import Transfer

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


class DmaEngine:
    """Moves blocks between a HostPool and a DevicePool of the same backend, ids chosen on the host.

        with pulseio.DmaEngine(host, device) as dma:    # host, device: same backend and block_bytes
            t = dma.recall(host_ids=np.array([7, 90_001]), device_slots=np.array([0, 1]))   # a Transfer
            t.device_wait()                             # the stream waits, not the host
            dma.offload(device_slots=[5], host_ids=[42]).wait()

    config: a `DmaConfig` (staging, the copy kernels' CTA budget, max_inflight, `auto=` the `AutoPolicy`
    behind Strategy.AUTO). recall(host_ids=, device_slots=), offload(device_slots=, host_ids=) and
    submit(plan) (a `TransferPlan`, e.g. from plan_recall(host_ids=, device_slots=), validated once for a
    transfer repeated many times) take `strategy=` (default AUTO) and return a `Transfer` (a `Handle`)
    without waiting for the copy, only for room past max_inflight (their `_nowait` twins raise WouldBlock).
    statistics(): counters; close() (or `with`): finishes what was submitted, stops the worker.

    Bad input raises on `submit`'s thread and queues nothing. A failure while copying (a CUDA error)
    fails the transfers of that one issue -- merged transfers share it -- and the engine goes on.

    Transfers in flight together are not ordered (own streams, merged copies, the RESIDENT kernel copies
    consecutive tasks at once): two must not write one block or slot, nor one read what another writes.
    Submit the dependent one once the first has landed: after `wait()`, or `stream_ordered=True` behind
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
        validate.warm_up()  # `make_plan`'s id check compiled now, not by the first transfer
        self._inflight = InFlight(self._synchronize, self._query, self._resolve)
        self._routes = host.backend.open_routes(host, device, self.config, self._inflight.reclaim)
        self._lock = threading.Lock()
        self._closed = False
        self._dead: BaseException | None = None  # why the worker thread died, once it has
        self._seq = 0
        self._submitted = self._completed = self._failed = self._bytes = self._issues = 0  # under _lock
        self._by_strategy: dict[Strategy, int] = {}  # keyed by member: .value is a Python call per transfer
        self._issuer = Issuer(self._routes, self._inflight, merge_blocks=self.config.merge_blocks,
                              inline_issue=self.config.inline_issue, on_dead=self._worker_died)

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

    def plan_recall(self, *, host_ids: IdArray, device_slots: IdArray) -> TransferPlan:
        """The recall `recall(host_ids=, device_slots=)` would submit, validated against these pools, for
        `submit(plan)`: a transfer repeated many times (a layer recalled every step) pays the validation
        and the coalescing into runs once. Raises as `recall` does on bad ids."""
        return self._plan(Direction.H2D, host_ids, device_slots)

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

        Where it is issued: see `pulseio._issuer`. launch_here=False: never issue a launch route on this
        thread (the doorbell's poller, which must never block in a driver call, passes it).

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
        try:
            self._issuer.offer(Queued(transfer, plan, after, raise_on_landed, posted_task), launch_here=launch_here)
        except ClosedError as exc:  # close() began after the check above: the transfer never started
            with self._lock:
                self._failed += 1
            transfer._set_failed(exc)
            raise
        return transfer

    def _worker_died(self, error: ClosedError, held: list[Queued]) -> None:
        """The issuer's worker died: fail what it held, and every later submit."""
        with self._lock:
            self._dead = error
            self._failed += len(held)
        for item in held:
            item.transfer._set_failed(error)

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
        self._issuer.close()
        self._inflight.stop()
        self._routes.close()

    def __enter__(self) -> DmaEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

