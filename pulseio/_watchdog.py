"""Watchdog: gives up on device waits that outlive their deadline, from a thread that never calls the driver.

A stream that waits for a request's word is released only by a store to that word. If the request
can never land (its publish never runs, the poller died, the GPU faulted), the stream and everything
that waits for the whole device behind it would hang. The watchdog calls `expire(item)` for every
armed item still armed at its deadline; the Runtime then fails the request and sets its word.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Watchdog:
    """Calls expire(item) on its own thread once an armed key reaches its deadline without `disarm`."""

    def __init__(self, expire: Callable[[Any], None]) -> None:
        self._expire = expire
        self._armed: dict[int, tuple[float, Any]] = {}  # key -> (deadline on time.monotonic, item)
        self._cond = threading.Condition()
        self._closed = False
        self.expired = 0
        self._thread = threading.Thread(target=self._run, name="pulseio-watchdog", daemon=True)
        self._thread.start()

    def arm(self, key: int, timeout: float, item: Any) -> None:
        with self._cond:
            self._armed[key] = (time.monotonic() + timeout, item)
            self._cond.notify()

    def disarm(self, key: int) -> None:
        with self._cond:
            self._armed.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    now = time.monotonic()
                    due = [k for k, (deadline, _) in self._armed.items() if deadline <= now]
                    if due:
                        break
                    nearest = min((d for d, _ in self._armed.values()), default=now + 1.0)
                    self._cond.wait(max(nearest - now, 1e-3))
                if self._closed:
                    return
                items = [self._armed.pop(k)[1] for k in due]
                self.expired += len(items)
            for item in items:
                self._expire(item)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
