"""InFlight: work a DmaEngine left running, oldest first, finished by whichever thread needs it.

Each issue appends its pieces (a device event, then optional host work such as handing a staging
buffer back) and then a marker that resolves its transfers. No thread finishes them as a matter of
course, because waking a second Python thread per transfer costs more than copying 64 blocks:

* a thread that waits for a transfer works through the FIFO up to it, on its own thread;
* `done()` finishes what has already completed, without blocking;
* an issuer short of staging buffers finishes the oldest piece (`reclaim`);
* only transfers somebody watches without waiting (a done callback, a wait with a timeout) are
  driven by the background thread, which sleeps while nobody watches.

One consumer at a time takes the head, so pieces finish in stream order; markers resolve their
transfers outside the lock, so a callback may submit again.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .backend import Pending
from .errors import PulseInternalError


class Issue:
    """One issue of the engine: the transfers it carries and the first error any piece raised."""

    __slots__ = ("batch", "error", "device_event")

    def __init__(self, batch: list[Any]) -> None:
        self.batch = batch
        self.error: BaseException | None = None
        self.device_event: Any = None


class InFlight:
    """The FIFO of one engine. `resolve(issue)` finishes an issue's transfers (called once per issue)."""

    def __init__(
        self,
        synchronize: Callable[[Any], None],
        query: Callable[[Any], bool],
        resolve: Callable[[Issue], None],
    ) -> None:
        self._synchronize = synchronize
        self._query = query
        self._resolve = resolve
        self._items: deque[tuple[Issue, Pending | None]] = deque()
        self._head = threading.Lock()  # held by the one thread finishing the head item
        self._watch = threading.Condition()
        self._watched: set[Any] = set()
        self._stopping = False
        self._thread = threading.Thread(target=self._drive_watched, name="pulseio-dma-completion", daemon=True)
        self._thread.start()

    # -- producers (the issuing thread) ---------------------------------------------------------

    def piece(self, issue: Issue, pending: Pending) -> None:
        self._items.append((issue, pending))
        issue.device_event = pending.event

    def marker(self, issue: Issue) -> None:
        """After an issue's last piece: resolve its transfers once everything before has finished."""
        self._items.append((issue, None))
        if self._watched:
            with self._watch:
                self._watch.notify()

    # -- consumers -------------------------------------------------------------------------------

    def step(self, block: bool) -> bool:
        """Finish the oldest item. False if there is none, or (block=False) it is still running or
        another thread is finishing it."""
        if not self._head.acquire(blocking=block):
            return False
        marker = None
        try:
            if not self._items:
                return False
            issue, pending = self._items[0]
            if pending is None:
                marker = issue
            else:
                if not block and not self._query(pending.event):
                    return False
                try:
                    self._synchronize(pending.event)
                    if pending.then is not None:
                        pending.then()
                except Exception as exc:  # fail this issue's transfers; later pieces still recycle
                    issue.error = issue.error or exc
            self._items.popleft()
            if marker is None and self._items and self._items[0] == (issue, None):  # its last piece: resolve too
                marker = self._items.popleft()[0]
        finally:
            self._head.release()
        if marker is not None:
            self._resolve(marker)
        return True

    def finish(self, transfer: Any) -> None:
        """On the waiting thread: work through the FIFO until `transfer` has finished."""
        if not transfer._issued._is_set:
            transfer._issued.wait()
        while not transfer._finished._is_set:
            if not self.step(block=True):
                # Empty: another thread is resolving our marker, or the issuer is about to push it.
                transfer._finished.wait(50e-6)

    def poll(self) -> None:
        """Finish everything already complete at the head, without blocking."""
        while self.step(block=False):
            pass

    def reclaim(self) -> bool:
        """Finish the oldest piece (blocking); False if nothing is in flight."""
        return self.step(block=True)

    def watch(self, transfer: Any) -> None:
        """Have the background thread finish `transfer` (it has callbacks, or a waiter with a timeout)."""
        with self._watch:
            self._watched.add(transfer)
            self._watch.notify()

    def _drive_watched(self) -> None:
        while True:
            with self._watch:
                while not self._watched and not self._stopping:
                    self._watch.wait()
                if self._stopping and not self._watched:
                    return
            if self.step(block=True):
                continue
            with self._watch:  # nothing in flight: forget what finished, then sleep until a marker or a watch
                self._watched = {t for t in self._watched if not t._finished.is_set()}
                if self._watched:  # watched but not issued yet: the issuer's marker wakes us
                    self._watch.wait(1e-3)

    # -- lifecycle -------------------------------------------------------------------------------

    def drain(self) -> None:
        """Finish everything (the engine has stopped issuing)."""
        while self.step(block=True):
            pass
        if self._items:
            raise PulseInternalError(f"{len(self._items)} in-flight items left after draining")

    def stop(self) -> None:
        self.drain()
        with self._watch:
            self._stopping = True
            self._watched.clear()
            self._watch.notify()
        self._thread.join()
