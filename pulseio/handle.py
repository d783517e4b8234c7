"""Handle: the one contract of every transfer a user holds (`Transfer` from a DmaEngine, `Completion` from
a Runtime), stated once, in the class's docstring (`help(pulseio.Handle)`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from ._once import Latch
from .errors import PulseInternalError, WaitTimeout

H = TypeVar("H", bound="Handle")


class Handle:
    """One transfer in flight, and the only thing anyone waits on. You get one from `DmaEngine.recall` /
    `offload` / `submit` (a `Transfer`) or `Runtime.post_recall` (a `Completion`); you never make one.
    It finishes exactly once, on a pulseio thread, landed or failed, never both.

        handle.done()                 never waits: True once landed or failed
        handle.wait(timeout=None)     waits (GIL released); returns the handle, raises WaitTimeout on timeout
                                      and the transfer's error (TransferError, ClosedError) if it failed
        handle.exception()            the error, or None; meaningful once done()
        await handle                  the same as wait() for an event loop (uvloop or asyncio); cancelling
                                      the await leaves the transfer running
        handle.device_wait(stream)    later work on `stream` (default: current) runs once the data has landed
                                      or the transfer failed; raises at once if it already failed. Never waits
                                      on the host for the copy itself; routes whose copy is a launch may wait
                                      until it is enqueued (the doorbell's contract: `pulseio.runtime`).
                                      On the host backend, with no device, it waits on the host.
        handle.add_done_callback(fn)  fn(handle) on the finishing thread (now, if already done)

    Fields: seq (submit order for a Transfer, publish order for a Completion), tag (the caller's, or None),
    num_blocks, nbytes, and the timing fields on one clock (`time.perf_counter_ns`): submitted_ns,
    finished_ns (None until done), latency_s. A timeout changes nothing: the copy may still be running, and
    every buffer it may write stays reserved until it has finished.
    """

    __slots__ = ("seq", "tag", "num_blocks", "nbytes", "submitted_ns", "finished_ns", "_exception", "_lock",
                 "_finished", "_callbacks")  # one per transfer: keep creation cheap

    def __init__(self, *, seq: int, tag: int | None, num_blocks: int = 0, nbytes: int = 0) -> None:
        self.seq = seq
        self.tag = tag
        self.num_blocks = num_blocks
        self.nbytes = nbytes
        self.submitted_ns = time.perf_counter_ns()
        self.finished_ns: int | None = None
        self._exception: BaseException | None = None
        self._lock = threading.Lock()
        self._finished = Latch()
        self._callbacks: list[Callable[[Any], None]] | None = None

    @property
    def latency_s(self) -> float | None:
        """Seconds from submit to finished, once done."""
        return None if self.finished_ns is None else (self.finished_ns - self.submitted_ns) / 1e9

    def done(self) -> bool:
        """True once finished (landed or failed). Never waits."""
        return self._finished.is_set()

    def wait(self: H, timeout: float | None = None) -> H:
        """Wait, GIL released, until finished; returns self. Raises WaitTimeout after `timeout` seconds, and
        the failure if there was one."""
        finished = self._finished
        if not finished._is_set:  # the attribute, not is_set(): this runs once per transfer
            self._help_finish(timeout)
            if not finished.wait(timeout):
                raise WaitTimeout(f"{self!r} has not finished after {timeout} s; it goes on, and the buffers it "
                                  "may write stay reserved until it has")
        if self._exception is not None:
            raise self._exception
        return self

    def _help_finish(self, timeout: float | None) -> None:
        """Before a wait: a handle whose work the waiting thread can finish itself does it here."""

    def exception(self) -> BaseException | None:
        """The failure, or None; meaningful once done()."""
        return self._exception

    def device_wait(self, stream: Any = None) -> None:
        """Make `stream` (default: current) run its later work once the data has landed; see the module doc."""
        raise NotImplementedError

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        """Call fn(self) once finished, on the thread that finishes it (now, if already done)."""
        with self._lock:
            if not self._finished.is_set():
                if self._callbacks is None:  # most transfers never get one: no list until then
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def __await__(self: H) -> Generator[Any, None, H]:
        """Await until done; returns self or raises the error. Cancelling the await leaves the transfer running."""
        yield from self._future().__await__()
        return self

    def _future(self) -> asyncio.Future[Any]:
        """A future of the running loop that settles when this finishes (one loop wake-up per handle)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def on_done(handle: Handle) -> None:
            loop.call_soon_threadsafe(settle, future, handle)

        self.add_done_callback(on_done)
        return future

    def _finish_locked(self, exception: BaseException | None) -> list[Callable[[Any], None]]:
        """With self._lock held: record the outcome, wake waiters; returns the callbacks to run unlocked."""
        if self._finished.is_set():
            raise PulseInternalError(f"{self!r} finished twice")
        self._exception = exception
        self.finished_ns = time.perf_counter_ns()
        self._finished.set()
        callbacks, self._callbacks = self._callbacks, None
        return callbacks or []


def settle(future: asyncio.Future[Any], handle: Handle) -> None:
    """On the loop: resolve `future` with `handle` or its error (unless the await was cancelled)."""
    if future.done():
        return
    error = handle.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(handle)
