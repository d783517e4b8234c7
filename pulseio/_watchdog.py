"""Watchdog: the thread that fails a device wait that cannot be met, and never calls the driver.

A stream that waits for a request's word is released only by a store to that word, and the copier
generation launched for it stays up (holding SMs, and keeping a device synchronize or a cudaFree
waiting) until the word is set. The watchdog looks at every armed item every `poll_s` (while any is
armed): once `landed(item)` it forgets it; if the item reaches its deadline first, `expire(item)` (the
Runtime fails the request and sets its word). Neither depends on any other pulseio thread, so a thread
stuck in a driver call cannot keep a stream waiting for good.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Watchdog:
    """Watches armed items on its own thread; see the module doc."""

    def __init__(self, *, landed: Callable[[Any], bool], expire: Callable[[Any], None], poll_s: float = 1e-3) -> None:
        self._landed, self._expire = landed, expire
        self._poll_s = poll_s
        self._armed: dict[int, tuple[float, Any]] = {}  # key -> (deadline on time.monotonic, item)
        self._cond = threading.Condition()
        self._closed = False
        self.expired = 0
        self._thread = threading.Thread(target=self._run, name="pulseio-watchdog", daemon=True)
        self._thread.start()

    def arm(self, key: int, timeout: float, item: Any) -> None:
        self.arm_all([(key, item)], timeout)

    def arm_all(self, items: list[tuple[int, Any]], timeout: float) -> None:
        """Arm (key, item) pairs with one deadline, under one lock."""
        deadline = time.monotonic() + timeout
        with self._cond:
            idle = not self._armed
            for key, item in items:
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
                armed = list(self._armed.items())
            now = time.monotonic()
            for key, (deadline, item) in armed:
                if self._landed(item):
                    self.disarm(key)
                elif deadline <= now:
                    self.disarm(key)
                    self.expired += 1
                    self._expire(item)
            time.sleep(self._poll_s)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
