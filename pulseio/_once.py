"""Latch: the one-shot event every pulseio handle (`pulseio.Handle`) waits on."""

from __future__ import annotations

import threading


class Latch:
    """A one-shot event on a bare lock, held from birth until `set`. Waits release the GIL.

    Every transfer makes two: `threading.Event` (a Condition) costs ~4 us to create, this ~0.2.
    `set` must be called at most once (the owner calls it under its own lock).
    """

    __slots__ = ("_lock", "_is_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._is_set = False

    def is_set(self) -> bool:
        return self._is_set

    def set(self) -> None:
        if not self._is_set:
            self._is_set = True
            self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        if self._is_set:
            return True
        if self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            self._lock.release()  # pass the wake-up on to the next waiter
            return True
        return self._is_set
