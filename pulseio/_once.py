"""FinishOnce: the mechanics both pulseio handles share (`Transfer`, `Completion`): finished exactly
once on a pulseio thread; host threads poll, wait (GIL released) or attach callbacks."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .errors import PulseInternalError


class FinishOnce:
    def __init__(self) -> None:
        self._exception: BaseException | None = None
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._callbacks: list[Callable[[Any], None]] = []

    def done(self) -> bool:
        """True once finished (landed or failed). Never waits."""
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait, GIL released, until finished; False on timeout. Raises the failure if there was one.

        A timeout changes nothing: the copy may still be running and its buffers stay reserved.
        """
        if not self._finished.wait(timeout):
            return False
        if self._exception is not None:
            raise self._exception
        return True

    def exception(self) -> BaseException | None:
        """The failure, or None; meaningful once done()."""
        return self._exception

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        """Call fn(self) once finished, on the pulseio thread that finishes it (now, if already done)."""
        with self._lock:
            if not self._finished.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def _finish_locked(self, exception: BaseException | None) -> list[Callable[[Any], None]]:
        """With self._lock held: record the outcome, wake waiters; returns the callbacks to run unlocked."""
        if self._finished.is_set():
            raise PulseInternalError(f"{self!r} finished twice")
        self._exception = exception
        self._finished.set()
        callbacks, self._callbacks = self._callbacks, []
        return callbacks
