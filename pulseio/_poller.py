"""Poller: the thread that reads the doorbell and turns each request into a recall on an I/O worker.

Per wake-up it takes every request published since its last look (one GIL-free spin, one read),
then per request: match it to the Completion posted for its seq, validate the ids (vectorised:
`make_plan`), submit the plan to an I/O worker (requests are spread over the workers by seq) with
no stream ordering (the publish kernel ran, so every kernel enqueued before it on its stream has
finished), and finish the Completion when the copy lands.

Every request ends by setting its wait word (`pulseio._wait_words`): a RESIDENT request's task sets
it on the device the moment it lands; every other ending (landed through another route, refused,
failed, given up by the watchdog) sets it from the host. A request that cannot be served fails its
own Completion only. If this thread dies, every request it has not served fails with the cause,
which `error` keeps and the Runtime raises from then on: nothing waits forever for a dead poller.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._wait_words import WaitWords
from .dma import DmaEngine
from .doorbell import Doorbell, Rung
from .errors import (
    ClosedError,
    InvalidRequestError,
    PulseError,
    PulseInternalError,
    TransferError,
    WaitTimeout,
    WouldBlock,
)
from .interrupts import Completion
from .plan import Strategy, TransferPlan
from .transfer import Transfer

log = logging.getLogger(__name__)


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
    post_to_seen: LatencySummary  # host clock: post_recall (publish launched) -> poller read it
    post_to_landed: LatencySummary  # host clock: post_recall -> pulseio saw the data land
    publish_to_taken: LatencySummary  # producer's clock: publish began -> the copier began it (RESIDENT)
    publish_to_landed: LatencySummary  # producer's clock: publish began -> the copier landed it (RESIDENT)
    publish_to_early_landed: LatencySummary  # producer's clock: publish began -> it landed early (those that did)
    copy_per_mib: LatencySummary  # producer's clock: the copier began it -> landed, per MiB it moved (RESIDENT)
    stamped_bytes: int = 0  # every request with both device stamps (RESIDENT): its bytes, and
    stamped_publish_to_landed_s: float = 0.0  # its publish -> landed, summed over all of them since the start
    stamped_requests: int = 0  # how many such requests landed, and
    landed_early: int = 0  # of them, those every copy CTA copied from the ids mirror before its task came


class Poller:
    """Reads `doorbell` on its own thread and recalls each request through `workers`."""

    def __init__(self, doorbell: Doorbell, workers: Sequence[DmaEngine], words: WaitWords, *,
                 plan: Callable[[np.ndarray, np.ndarray], TransferPlan], latency_samples: int = 4096,
                 wait_s: float = 0.05) -> None:
        self._doorbell = doorbell
        self._workers = list(workers)
        self._words = words
        self._plan = plan
        self._wait_s = wait_s
        self._pending: dict[int, Completion] = {}  # expected, not yet read
        self._cancelled: set[int] = set()  # given up before they were read: skipped when they are
        self._lock = threading.Lock()  # _pending, _cancelled and the counters
        self.error: PulseError | None = None  # why the thread died, once it has
        self._fast = np.zeros(doorbell.layout.capacity, dtype=np.int64)  # [capacity]: seq, or 0
        self._lane = self._open_lane()
        self._counts = {"completed": 0, "failed": 0, "bytes": 0, "stamped_bytes": 0, "stamped_ns": 0,
                        "stamped": 0, "early": 0}
        self._to_seen: deque[int] = deque(maxlen=latency_samples)
        self._to_landed: deque[int] = deque(maxlen=latency_samples)
        self._publish_to_taken: deque[int] = deque(maxlen=latency_samples)
        self._publish_to_landed: deque[int] = deque(maxlen=latency_samples)
        self._publish_to_early: deque[int] = deque(maxlen=latency_samples)
        self._copy_per_mib: deque[int] = deque(maxlen=latency_samples)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pulseio-poller", daemon=True)
        self._thread.start()

    def _open_lane(self) -> Any:
        """The fast lane: with one worker, RESIDENT requests are read, validated and posted as resident
        tasks by one compiled call (`task_ring.forward`) before any Python object is made for them."""
        copier = self._workers[0].resident
        if len(self._workers) != 1 or copier is None:
            return None
        worker = self._workers[0]
        lane = copier.forwarder(self._fast, worker.host.num_blocks, worker.device.num_slots, self._words.base,
                                self._words.slots)
        if lane is None:
            log.warning("numba is not installed: the doorbell's fast lane is off, so each RESIDENT request "
                        "takes the regular path (tens of microseconds more); pip install numba")
        return lane

    def expect(self, *completions: Completion) -> None:
        """Register the completions of the requests that will be published as their seqs (one lock for all)."""
        with self._lock:
            self._check_alive()
            for completion in completions:
                self._pending[completion.seq] = completion
        if self._lane is not None:
            for completion in completions:
                if completion.strategy is Strategy.RESIDENT:
                    self._fast[(completion.seq - 1) % len(self._fast)] = completion.seq

    def forget(self, seq: int) -> None:
        """Drop an expectation whose publish was never launched (its launch raised)."""
        with self._lock:
            self._pending.pop(seq, None)

    def cancel(self, completion: Completion) -> bool:
        """Make sure request `completion.seq` is never copied, if it has not reached a copier yet: True
        if so (the caller then fails it). False once a copier has it (it may still land). A resident
        copier reading an ids mirror may copy it early all the same, as it is published, until the poller
        has read it and fenced its row (`resident_kernel.py`, `TaskRing.fence_row`)."""
        seq = completion.seq
        if self._lane is not None and completion.strategy is Strategy.RESIDENT:
            if not self._workers[0].resident.unmark(self._fast, seq):
                return False  # the lane took it (it clears the mark of what it takes) or it was read already
        with self._lock:
            if self._pending.pop(seq, None) is None:
                return False
            self._cancelled.add(seq)
            return True

    # -- the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            for worker in self._workers:
                worker.bind_thread()  # now, not behind a device wait: binding may call the driver
            while not self._stop.is_set():
                try:
                    rungs = self._doorbell.wait_rung(timeout=self._wait_s, lane=self._lane)
                except WaitTimeout:  # nothing published for a while: look at the stop flag
                    continue
                except ClosedError:
                    return
                for rung in rungs:
                    self._dispatch(rung)
        except BaseException as exc:  # noqa: BLE001 - a dead poller must fail its requests, whatever killed it
            self._die(exc)

    def _die(self, cause: BaseException) -> None:
        error = PulseError(f"pulseio's poller thread died ({cause!r}): the requests it had not served failed, "
                           "and this runtime takes no more; close it")
        error.__cause__ = cause
        log.error("%s", error, exc_info=cause)
        with self._lock:
            self.error = error
        self.fail_pending(TransferError(str(error)))

    def _check_alive(self) -> None:
        if self.error is not None:
            raise self.error

    def _dispatch(self, rung: Rung) -> None:
        with self._lock:
            cancelled = rung.seq in self._cancelled  # the watchdog failed it already; never copy it
            self._cancelled.discard(rung.seq)
            completion = None if cancelled else self._pending.pop(rung.seq, None)
        if self._lane is not None and not rung.task:  # not a task naming its ids-mirror row: fence the row
            self._workers[0].resident.fence_row(rung.seq)
        if cancelled:
            return
        if completion is None:  # published without post_recall/expect_published: nobody waits for it
            completion = Completion(seq=rung.seq, tag=rung.tag, device_waiter=_unheld, awaiter=_unheld)
        completion.published_ns, completion.seen_ns = rung.published_ns, rung.seen_ns
        self._to_seen.append(rung.seen_ns - completion.submitted_ns)
        error = rung.error
        if error is None and completion.tag is not None and completion.tag != rung.tag:
            error = (f"doorbell request seq={rung.seq} carries tag {rung.tag} but the request posted as seq "
                     f"{rung.seq} has tag {completion.tag}: publishes reached the ring in another order than "
                     "they were posted (a kernel published without expect_published, or unordered streams)")
        completion.tag = rung.tag if completion.tag is None else completion.tag
        if error is not None:
            return self.fail(completion, TransferError(error))
        try:
            plan = self._plan(rung.host_ids, rung.device_slots)
        except InvalidRequestError as exc:
            return self.fail(completion, TransferError(f"doorbell request seq={rung.seq} tag={rung.tag}: {exc}"))
        completion.num_blocks, completion.nbytes = plan.num_blocks, plan.nbytes
        if plan.num_blocks == 0:
            return self._finish(completion, None)
        strategy = Strategy.RESIDENT if rung.task else completion.strategy
        worker = self._workers[rung.seq % len(self._workers)]
        transfer = self._submit(worker, plan, strategy, completion, rung.task or None)
        if transfer is not None:
            transfer.add_issued_callback(lambda _, c=completion: c._set_issued())  # type: ignore[misc]
            self.track(completion, transfer)

    def _submit(self, worker: DmaEngine, plan: TransferPlan, strategy: Strategy, completion: Completion,
                posted_task: int | None) -> Transfer | None:
        seq = completion.seq
        while True:
            try:
                transfer = worker._submit(plan, strategy=strategy, tag=seq, stream_ordered=False,
                                         raise_on_landed=(self._words.address(seq), seq), posted_task=posted_task,
                                         launch_here=False)  # this thread never blocks in a driver call
                completion.transfer = transfer
                return transfer
            except WouldBlock:  # the worker has max_inflight transfers: wait for room, not fail
                if self._stop.wait(50e-6):
                    self.fail(completion, ClosedError("the runtime closed before this recall could start"))
                    return None
            except (ClosedError, InvalidRequestError) as exc:
                self.fail(completion, TransferError(f"doorbell request seq={seq}: {exc}"))
                return None

    # -- finishing ---------------------------------------------------------------------------------

    def track(self, completion: Completion, transfer: Transfer) -> None:
        """Finish `completion` when `transfer` lands or fails (also used for direct recalls)."""

        def landed(t: Transfer) -> None:
            error = t.exception()
            if error is not None and completion.seq > 0:
                error = TransferError(f"doorbell request seq={completion.seq} tag={completion.tag}: {error}")
            event = t.device_event  # a resident task's stamps: its slot holds them now
            if error is None and hasattr(event, "landed_ns"):
                completion.taken_ns, completion.landed_ns = event.taken_ns(), event.landed_ns()
                completion.early_landed_ns = event.early_landed_ns()
            self._finish(completion, error)

        transfer.add_done_callback(landed)

    def fail(self, completion: Completion, error: BaseException) -> None:
        """Fail a request (its wait word is set: no stream waits for it any longer)."""
        self._finish(completion, error)

    def _finish(self, completion: Completion, error: BaseException | None) -> None:
        if completion.seq > 0:
            self._words.set(completion.seq)
        if not completion._finish(error):
            return  # the watchdog gave up on it earlier; it was counted then
        published, landed = completion.published_ns, completion.landed_ns
        span = landed - published if error is None and published is not None and landed is not None else None
        with self._lock:
            if error is None:
                self._counts["completed"] += 1
                self._counts["bytes"] += completion.nbytes
            else:
                self._counts["failed"] += 1
            if span is not None:
                self._counts["stamped_bytes"] += completion.nbytes
                self._counts["stamped_ns"] += span
                self._counts["stamped"] += 1
                self._counts["early"] += completion.early_landed_ns is not None
        if error is None and completion.finished_ns is not None:
            self._to_landed.append(completion.finished_ns - completion.submitted_ns)
        if span is not None:
            self._publish_to_landed.append(span)
        if span is not None and published is not None and completion.early_landed_ns is not None:
            self._publish_to_early.append(completion.early_landed_ns - published)
        if span is not None and published is not None and completion.taken_ns is not None:
            self._publish_to_taken.append(completion.taken_ns - published)
            if completion.nbytes:          # landed = published + span
                self._copy_per_mib.append((published + span - completion.taken_ns) * 2**20 // completion.nbytes)

    # -- lifecycle ---------------------------------------------------------------------------------

    def fail_pending(self, error: BaseException) -> None:
        """Fail every expected request not yet read (close: their publishes never ran; or the poller died)."""
        with self._lock:
            pending, self._pending = sorted(self._pending.items()), {}
            self._cancelled.update(seq for seq, _ in pending)
        for _, completion in pending:
            self.fail(completion, error)

    def slot_state(self, seq: int) -> str:
        """Where request seq stands in the doorbell (see Doorbell.slot_state)."""
        return self._doorbell.slot_state(seq)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def statistics(self) -> PollerStatistics:
        with self._lock:
            c = dict(self._counts)
        return PollerStatistics(completed=c["completed"], failed=c["failed"], bytes_moved=c["bytes"],
                                post_to_seen=LatencySummary.of(list(self._to_seen)),
                                post_to_landed=LatencySummary.of(list(self._to_landed)),
                                publish_to_taken=LatencySummary.of(list(self._publish_to_taken)),
                                publish_to_landed=LatencySummary.of(list(self._publish_to_landed)),
                                publish_to_early_landed=LatencySummary.of(list(self._publish_to_early)),
                                copy_per_mib=LatencySummary.of(list(self._copy_per_mib)),
                                stamped_bytes=c["stamped_bytes"], stamped_publish_to_landed_s=c["stamped_ns"] / 1e9,
                                stamped_requests=c["stamped"], landed_early=c["early"])


def _unheld(completion: Completion, *_: object) -> Any:
    raise PulseInternalError(f"{completion!r} was published without being posted: nobody holds it to wait on")
