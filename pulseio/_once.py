"""FinishOnce: the mechanics both pulseio handles share (`Transfer`, `Completion`): finished exactly
once on a pulseio thread; host threads poll, wait (GIL released) or attach callbacks."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .errors import PulseInternalError


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


class FinishOnce:
    __slots__ = ("_exception", "_lock", "_finished", "_callbacks")  # one per transfer: keep creation cheap

    def __init__(self) -> None:
        self._exception: BaseException | None = None
        self._lock = threading.Lock()
        self._finished = Latch()
        self._callbacks: list[Callable[[Any], None]] | None = None

    def done(self) -> bool:
        """True once finished (landed or failed). Never waits."""
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait, GIL released, until finished; False on timeout. Raises the failure if there was one.

        A timeout changes nothing: the copy may still be running and its buffers stay reserved.
        """
        finished = self._finished
        if not finished._is_set:  # the attribute, not is_set(): this runs once per transfer
            self._help_finish(timeout)
            if not finished.wait(timeout):
                return False
        if self._exception is not None:
            raise self._exception
        return True

    def _help_finish(self, timeout: float | None) -> None:
        """Before a wait: a handle whose work the waiting thread can finish itself does it here."""

    def exception(self) -> BaseException | None:
        """The failure, or None; meaningful once done()."""
        return self._exception

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        """Call fn(self) once finished, on the thread that finishes it (now, if already done)."""
        with self._lock:
            if not self._finished.is_set():
                if self._callbacks is None:  # most transfers never get one: no list until then
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def _finish_locked(self, exception: BaseException | None) -> list[Callable[[Any], None]]:
        """With self._lock held: record the outcome, wake waiters; returns the callbacks to run unlocked."""
        if self._finished.is_set():
            raise PulseInternalError(f"{self!r} finished twice")
        self._exception = exception
        self._finished.set()
        callbacks, self._callbacks = self._callbacks, None
        return callbacks or []
