"""Watchdog: the thread that fails a device wait that cannot be met, and never calls the driver.

A stream that waits for a request's word is released only by a store to that word, and the copier
generation launched for it stays up (holding SMs, and keeping a device synchronize or a cudaFree
waiting) until the word is set. The watchdog looks at the armed items every `poll_s` (while any is
armed): once `landed(item)` it forgets it; if the item reaches its deadline first, `expire(item)` (the
Runtime fails the request and sets its word). Neither depends on any other pulseio thread, so a thread
stuck in a driver call cannot keep a stream waiting for good.

Every item is armed with the same timeout, so the items in arming order are in deadline order (an item
armed again moves to the end). A look takes items from the front only, while they have landed or are due:
the first one that has neither is the earliest deadline left, so nothing behind it is due. A look costs
the items that landed since the last one, not every item armed: the thread takes the GIL for it, and a
serving loop arms tens of requests a step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Watchdog:
    """Watches armed items on its own thread; see the module doc."""

    def __init__(self, *, landed: Callable[[Any], bool], expire: Callable[[Any], None], timeout_s: float,
                 poll_s: float = 1e-3) -> None:
        self._landed, self._expire = landed, expire
        self._timeout, self._poll_s = timeout_s, poll_s
        self._armed: dict[int, tuple[float, Any]] = {}  # key -> (deadline on time.monotonic, item), in arming order
        self._cond = threading.Condition()
        self._closed = False
        self.expired = 0
        self._thread = threading.Thread(target=self._run, name="pulseio-watchdog", daemon=True)
        self._thread.start()

    def arm(self, key: int, item: Any) -> None:
        self.arm_all([(key, item)])

    def arm_all(self, items: list[tuple[int, Any]]) -> None:
        """Arm (key, item) pairs, due `timeout_s` from now, under one lock."""
        deadline = time.monotonic() + self._timeout
        with self._cond:
            idle = not self._armed
            for key, item in items:
                self._armed.pop(key, None)  # armed again: to the end, where its deadline now belongs
                self._armed[key] = (deadline, item)
            if idle and self._armed:  # otherwise the thread is polling already
                self._cond.notify()

    def disarm(self, key: int) -> None:
        with self._cond:
            self._armed.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._armed and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
            self._look(time.monotonic())
            with self._cond:
                if not self._closed:
                    self._cond.wait(self._poll_s)  # close (or an arm) wakes it early

    def _look(self, now: float) -> None:
        """Forget the landed items and expire the due ones at the front, up to the first that is neither."""
        while True:
            with self._cond:
                if not self._armed:
                    return
                key, (deadline, item) = next(iter(self._armed.items()))
            landed = self._landed(item)
            if not landed and deadline > now:
                return
            with self._cond:
                entry = self._armed.get(key)
                if entry is None or entry[0] != deadline or entry[1] is not item:
                    continue  # disarmed or armed again meanwhile: look at the front again
                del self._armed[key]
            if not landed:
                self.expired += 1
                self._expire(item)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
