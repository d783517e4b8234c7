"""Issuer: turns a DmaEngine's accepted transfers into device work, on the submitting thread or its worker.

A route whose issue is a post (RESIDENT, unordered) is issued on the submitting thread: a few stores, no
driver call, no lock another issuer holds. A route that is only a launch is issued there too when nothing
is queued ahead and no other thread is issuing (one thread hop less per transfer). Everything else goes
to the worker thread, which drains the queue, merges queued transfers of one route into one issue (many
small recalls, one DMA), and enqueues their device work. What an issue leaves running goes to `InFlight`.
If the worker dies, every transfer it held or had queued fails, and so does every later submit.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._inflight import InFlight, Issue
from .backend import RouteSet
from .errors import ClosedError
from .plan import TransferPlan
from .transfer import Transfer, TransferState

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Queued:
    """One accepted transfer and what its issue needs."""

    transfer: Transfer
    plan: TransferPlan
    after: Any  # the submitting stream's point to start after, or None
    raise_on_landed: tuple[int, int] | None = None
    posted_task: int | None = None


_STOP = object()


class Issuer:
    """The issuing side of one DmaEngine: `offer` never waits; `close` issues what is queued, then stops."""

    def __init__(self, routes: RouteSet, inflight: InFlight, *, merge_blocks: int, inline_issue: bool,
                 on_dead: Callable[[ClosedError, list[Queued]], None]) -> None:
        self._routes, self._inflight = routes, inflight
        self._merge_blocks, self._inline_issue = merge_blocks, inline_issue
        self._on_dead = on_dead
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()  # _queued
        self._issue_lock = threading.Lock()  # one issuer at a time keeps the copy stream in submit order
        self._queued = 0  # handed to the worker, not yet issued
        self._closed = False  # set under _lock with the stop marker: nothing is queued behind it
        self._thread = threading.Thread(target=self._work, name="pulseio-dma-worker", daemon=True)
        self._thread.start()

    def offer(self, item: Queued, *, launch_here: bool) -> None:
        """Issue `item` here if its route allows (see the module doc), else queue it for the worker.
        Raises ClosedError once `close` has begun (the item was neither issued nor queued)."""
        strategy = item.transfer.strategy
        posted = strategy in self._routes.posted and item.after is None
        with self._lock:
            if self._closed:
                raise ClosedError("this DmaEngine is closed")
            inline = posted or (
                launch_here and self._inline_issue and strategy in self._routes.inline and self._queued == 0
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

    def _work(self) -> None:
        batch: list[Queued] = []
        carry: Any = None
        try:
            self._routes.bind_thread()
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
            self._die(exc, batch + ([carry] if carry is not None and carry is not _STOP else []))

    def _die(self, cause: BaseException, held: list[Queued]) -> None:
        error = ClosedError(f"this DmaEngine's worker thread died ({cause!r}); close the engine")
        error.__cause__ = cause
        log.error("%s", error, exc_info=cause)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                held.append(item)
        self._on_dead(error, [q for q in held if q.transfer.state is TransferState.QUEUED])

    def _drain(self, first: Queued) -> tuple[list[Queued], Any]:
        """Merge queued transfers of the same route behind `first`, up to merge_blocks blocks. Transfers that
        carry their own landing word or an already posted task are issued alone."""
        batch, blocks = [first], first.plan.num_blocks
        alone = first.posted_task is not None or first.raise_on_landed is not None
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, None
            same_route = (
                item is not _STOP and not alone
                and item.transfer.strategy is first.transfer.strategy
                and item.plan.direction is first.plan.direction
                and item.posted_task is None and item.raise_on_landed is None
            )
            if not same_route or blocks + item.plan.num_blocks > self._merge_blocks:
                return batch, item
            batch.append(item)
            blocks += item.plan.num_blocks

    def _issue(self, batch: list[Queued]) -> None:
        first = batch[0]
        issue = Issue(batch)
        after = [q.after for q in batch if q.after is not None]
        try:
            self._routes.issue(
                first.transfer.strategy, [q.plan for q in batch], after,
                lambda pending: self._inflight.piece(issue, pending), first.raise_on_landed, first.posted_task,
            )
        except Exception as exc:  # a route failure fails these transfers; the engine keeps serving
            log.debug("issue of %d transfers failed", len(batch), exc_info=True)
            issue.error = exc
            for q in batch:  # their device waits end now; wait() once the FIFO reaches the marker
                q.transfer._set_issue_failed(exc)
        else:
            for q in batch:
                q.transfer._set_issued(issue.device_event)
        self._inflight.marker(issue)  # after every piece: resolve the batch

    def close(self) -> None:
        """Issue what is queued, then stop the worker."""
        with self._lock:
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()
