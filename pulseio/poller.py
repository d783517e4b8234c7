"""Poller: the thread that reads the doorbell and turns each request into a recall on an I/O worker.

Per wake-up it takes every request published since its last look (one GIL-free spin, one read),
then per request: match it to the Completion posted for its seq, validate the ids (vectorised:
`make_plan`), submit the plan to an I/O worker (a `DmaEngine`; requests are spread over the
workers by seq) with no stream ordering (the publish kernel ran, so every kernel enqueued before
it on its stream has finished), and hook the transfer: when its copies are enqueued, the new
watermark goes to the device completion word; when they land, the Completion finishes. A request
that cannot be served (bad ids, bad count, lost to a lap) fails its own Completion only.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .dma import DmaEngine
from .doorbell import Doorbell, Rung
from .errors import ClosedError, InvalidRequestError, PulseInternalError, TransferError, WouldBlock
from .interrupts import Completion, CompletionOrder
from .plan import Direction, Strategy, TransferPlan
from .transfer import Transfer


class Signal(Protocol):
    """Where the completion watermark goes: the device completion word, or nowhere on the host backend."""

    device_word: int  # address of the device completion word (int64); 0 where there is none

    def signal(self, events: list[Any], watermark: int) -> None:
        """After the copies behind `events`, raise the word to at least `watermark` (never lower it)."""


@dataclass(frozen=True)
class LatencySummary:
    """Percentiles of a latency sample, in microseconds."""

    count: int
    p50_us: float
    p99_us: float

    @classmethod
    def of(cls, samples_ns: Sequence[int]) -> LatencySummary:
        if not samples_ns:
            return cls(0, float("nan"), float("nan"))
        p50, p99 = np.percentile(np.asarray(samples_ns, dtype=np.float64) / 1e3, [50, 99])
        return cls(len(samples_ns), float(p50), float(p99))


@dataclass(frozen=True)
class PollerStatistics:
    completed: int
    failed: int
    bytes_moved: int
    held_back: int  # requests landed but not yet in the device watermark (an earlier one is in flight)
    watermark: int  # the highest seq such that it and all before it landed or failed
    post_to_seen: LatencySummary  # host clock: post_recall (publish launched) -> poller read it
    post_to_landed: LatencySummary  # host clock: post_recall -> pulseio saw the data land


class Poller:
    """Reads `doorbell` on its own thread and recalls each request through `workers`."""

    def __init__(self, doorbell: Doorbell, workers: Sequence[DmaEngine], signal: Signal, *,
                 plan: Callable[[np.ndarray, np.ndarray], TransferPlan], latency_samples: int = 4096,
                 wait_s: float = 0.05) -> None:
        self._doorbell = doorbell
        self._workers = list(workers)
        self._signal = signal
        self._plan = plan
        self._wait_s = wait_s
        self._pending: dict[int, tuple[Completion, Strategy]] = {}
        self._lock = threading.Lock()  # _pending and the counters
        self._signal_lock = threading.Lock()  # _order and the signal writes, in watermark order
        self._order = CompletionOrder()
        # requests submitted and not yet landed: all of them, and those whose own copy kernel raises
        # the device word when they land, per worker (see _raise_for)
        self._outstanding = 0
        self._outstanding_raised = [0] * len(self._workers)
        self._init_lane()
        self._counts = {"completed": 0, "failed": 0, "bytes": 0}
        self._to_seen: deque[int] = deque(maxlen=latency_samples)
        self._to_landed: deque[int] = deque(maxlen=latency_samples)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pulseio-poller", daemon=True)
        self._thread.start()

    def _init_lane(self) -> None:
        """The fast lane: with one worker that has a resident copier, requests recalled through it are
        read, validated and posted by one compiled call (`task_ring.forward`) before any Python object
        is made for them. `_fast` marks the seqs that may take it."""
        worker = self._workers[0]
        self._copier = worker.resident if len(self._workers) == 1 else None
        self._fast = np.zeros(self._doorbell.layout.capacity, dtype=np.int64)  # [capacity]: seq, or stale
        counts = [1 << i for i in range(16) if 1 << i <= self._doorbell.layout.blocks_per_slot]
        choose = worker.config.auto.choose
        self._auto_resident = all(choose(Direction.H2D, worker.host.block_bytes, c) is Strategy.RESIDENT
                                  for c in counts)

    def expect(self, completion: Completion, strategy: Strategy) -> None:
        """Register the completion of the request that will be published as `completion.seq`."""
        with self._lock:
            self._pending[completion.seq] = (completion, strategy)
        if self._copier is not None and (
            strategy is Strategy.RESIDENT or (strategy is Strategy.AUTO and self._auto_resident)
        ):
            self._fast[(completion.seq - 1) % len(self._fast)] = completion.seq

    def _lane(self) -> Any:
        """The fast-lane reader for the next read, or None. Its tasks raise the device word themselves
        when every request in flight is one of the copier's own (see _raise_for)."""
        if self._copier is None:
            return None
        worker = self._workers[0]
        raise_at = self._signal.device_word if self._alone(0) else 0
        return self._copier.forwarder(self._fast, worker.host.num_blocks, worker.device.num_slots, raise_at)

    def forget(self, seq: int) -> None:
        """Drop an expectation whose publish was never launched (its launch raised)."""
        with self._lock:
            self._pending.pop(seq, None)

    # -- the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rungs = self._doorbell.wait_rung(timeout=self._wait_s, lane=self._lane())
            except ClosedError:
                return
            for rung in rungs:
                self._dispatch(rung)

    def _dispatch(self, rung: Rung) -> None:
        with self._lock:
            completion, strategy = self._pending.pop(rung.seq, (None, Strategy.AUTO))
        if completion is None:  # published without post_recall/expect_published: nobody waits for it
            completion = Completion(seq=rung.seq, tag=rung.tag, device_waiter=_unheld, awaiter=_unheld)
        completion.published_ns, completion.seen_ns = rung.published_ns, rung.seen_ns
        self._to_seen.append(rung.seen_ns - completion.posted_ns)
        error = rung.error
        if error is None and completion.tag is not None and completion.tag != rung.tag:
            error = (f"doorbell request seq={rung.seq} carries tag {rung.tag} but the request posted as seq "
                     f"{rung.seq} has tag {completion.tag}: publishes reached the ring in another order than "
                     "they were posted (a kernel published without expect_published, or unordered streams)")
        completion.tag = rung.tag if completion.tag is None else completion.tag
        if error is not None:
            return self._fail(completion, TransferError(error))
        try:
            plan = self._plan(rung.host_ids, rung.device_slots)
        except InvalidRequestError as exc:
            return self._fail(completion, TransferError(f"doorbell request seq={rung.seq} tag={rung.tag}: {exc}"))
        completion.num_blocks, completion.nbytes = plan.num_blocks, plan.nbytes
        if plan.num_blocks == 0:
            self._ready(completion.seq, None)
            return self._finish(completion, None)
        index = rung.seq % len(self._workers)
        if rung.task:  # the fast lane posted it already
            raise_to, strategy = None, Strategy.RESIDENT
        else:
            raise_to = self._raise_for(index, completion.seq)
        transfer = self._submit(self._workers[index], plan, strategy, completion, raise_to, rung.task or None)
        if transfer is not None:
            raised = (rung.raised if rung.task else
                      raise_to is not None and transfer.strategy in self._workers[index].raises_on_device)
            self._count(index, raised, 1)
            transfer.add_issued_callback(lambda t, c=completion, r=raised: self._ready(c.seq, t.device_event, r))
            transfer.add_done_callback(lambda t, i=index, r=raised: self._count(i, r, -1))
            self.track(completion, transfer)

    def _raise_for(self, index: int, seq: int) -> tuple[int, int] | None:
        """(device word, seq) if the copy of request seq may raise the completion word itself when it
        lands: only if every earlier request still in flight is one whose copy lands before it (raised
        by the same worker's in-order kernel), so that word >= seq still means all up to seq landed.
        Then no stream operation stands between the copy and the consumer (the signal is skipped)."""
        return (self._signal.device_word, seq) if self._alone(index) else None

    def _alone(self, index: int) -> bool:
        """Whether a copy on worker `index` may raise the device word now (see _raise_for)."""
        if not self._signal.device_word:
            return False
        with self._lock:
            return self._outstanding == self._outstanding_raised[index]

    def _count(self, index: int, raised: bool, delta: int) -> None:
        with self._lock:
            self._outstanding += delta
            if raised:
                self._outstanding_raised[index] += delta

    def _submit(self, worker: DmaEngine, plan: TransferPlan, strategy: Strategy, completion: Completion,
                raise_to: tuple[int, int] | None, posted_task: int | None) -> Transfer | None:
        while True:
            try:
                transfer = worker.submit(plan, strategy=strategy, tag=f"doorbell seq={completion.seq}",
                                         stream_ordered=False, raise_on_landed=raise_to, posted_task=posted_task)
                completion.transfer = transfer
                return transfer
            except WouldBlock:  # the worker has max_inflight transfers: wait for room, not fail
                if self._stop.wait(50e-6):
                    self._fail(completion, ClosedError("the runtime closed before this recall could start"))
                    return None
            except (ClosedError, InvalidRequestError) as exc:
                self._fail(completion, TransferError(f"doorbell request seq={completion.seq}: {exc}"))
                return None

    # -- finishing ---------------------------------------------------------------------------------

    def track(self, completion: Completion, transfer: Transfer) -> None:
        """Finish `completion` when `transfer` lands or fails (also used for direct recalls)."""

        def landed(t: Transfer) -> None:
            error = t.exception()
            if error is not None and completion.seq > 0:
                error = TransferError(f"doorbell request seq={completion.seq} tag={completion.tag}: {error}")
            self._finish(completion, error)

        transfer.add_done_callback(landed)

    def _ready(self, seq: int, event: Any, raised: bool = False) -> None:
        """Request seq is issued (event: its copies) or failed (None). raised: its copy raises the word."""
        with self._signal_lock:
            covered = self._order.ready(seq, (event, raised))
            if covered and not all(r for _, r in covered):
                self._signal.signal([e for e, _ in covered], self._order.watermark)

    def _fail(self, completion: Completion, error: BaseException) -> None:
        self._ready(completion.seq, None)
        self._finish(completion, error)

    def _finish(self, completion: Completion, error: BaseException | None) -> None:
        with self._lock:
            if error is None:
                self._counts["completed"] += 1
                self._counts["bytes"] += completion.nbytes
            else:
                self._counts["failed"] += 1
        completion._finish(error)
        if error is None and completion.landed_ns is not None:
            self._to_landed.append(completion.landed_ns - completion.posted_ns)

    # -- lifecycle ---------------------------------------------------------------------------------

    def fail_pending(self, error: BaseException) -> None:
        """Fail every expected request not yet read (close: their publishes never ran)."""
        with self._lock:
            pending, self._pending = sorted(self._pending.items()), {}
        for _, (completion, _) in pending:
            self._fail(completion, error)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def statistics(self) -> PollerStatistics:
        with self._lock:
            c = dict(self._counts)
        with self._signal_lock:
            held, watermark = self._order.waiting, self._order.watermark
        return PollerStatistics(completed=c["completed"], failed=c["failed"], bytes_moved=c["bytes"],
                                held_back=held, watermark=watermark,
                                post_to_seen=LatencySummary.of(list(self._to_seen)),
                                post_to_landed=LatencySummary.of(list(self._to_landed)))


def _unheld(completion: Completion, *_: Any) -> Any:
    raise PulseInternalError(f"{completion!r} was published without being posted: nobody holds it to wait on")
