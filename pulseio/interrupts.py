"""Completions and how they reach their waiters: host threads, GPU streams and event loops.

A `Completion` is the handle of one recall request. It finishes exactly once, on a pulseio thread
(the DMA completion thread, or the poller for a request that fails before any copy). From there:

* host threads: `done()`, `wait(timeout)`, `exception()`;
* GPU streams: `device_wait(stream)`: later work on the stream runs once the data has landed (the
  Runtime decides how: a wait on the request's word, or on its copy's event);
* event loops: `await completion`. The `InterruptPump` of that loop is the one path from a
  finished completion to a resolved future; it knows nothing of asyncio beyond the
  `call_soon_threadsafe` it was given, and a burst of completions costs the loop one wake-up.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ._once import Latch
from .handle import Handle
from .plan import Strategy


class Completion(Handle):
    """One recall request of a Runtime (a `pulseio.Handle`): landed or failed, never both. Doorbell
    requests add the producer's and the poller's stamps (published_ns on the device clock, seen_ns), and
    RESIDENT ones the copier's (taken_ns and landed_ns, on the producer's clock: landed_ns - published_ns
    is the request's time from publish to its data in place, as the device sees it; taken_ns splits it
    into the pickup and the copy; early_landed_ns, where the copy CTAs copied it from the ids mirror before
    its task came, is when it landed for a captured device wait, which ends there)."""

    def __init__(self, *, seq: int, tag: int | None, device_waiter: Callable[[Completion, Any], None],
                 awaiter: Callable[[Completion], Any], strategy: Strategy = Strategy.AUTO) -> None:
        super().__init__(seq=seq, tag=tag)
        self.strategy = strategy  # as posted: AUTO resolves per request, once its size is known
        self.published_ns: int | None = None  # the producer's stamp as its publish began (%globaltimer on the GPU)
        self.seen_ns: int | None = None  # perf_counter_ns when the poller read the request
        self.taken_ns: int | None = None  # the resident copier's stamp when it began the copy (%globaltimer)
        self.landed_ns: int | None = None  # the resident copier's stamp when the data landed (%globaltimer)
        self.early_landed_ns: int | None = None  # its stamp when the data had landed early (None: not early)
        self.transfer: Any = None  # the pulseio.Transfer carrying it, once submitted
        self._issued = Latch()  # set once its copies are enqueued, or it finished
        self._device_waiter = device_waiter
        self._awaiter = awaiter

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._exception else "done")
        return f"<Completion seq={self.seq} tag={self.tag!r} {self.num_blocks} blocks {state}>"

    def device_wait(self, stream: Any = None) -> None:
        """See `pulseio.Handle`; the doorbell's contract is in `pulseio.runtime`."""
        if self._exception is not None:
            raise self._exception
        self._device_waiter(self, stream)

    def wait_issued(self, timeout: float | None = None) -> bool:
        """Wait (GIL released) until the copies are enqueued or the request finished; False on timeout."""
        return self._issued.wait(timeout)

    def _future(self) -> Any:
        return self._awaiter(self)

    # -- called by pulseio's threads -----------------------------------------------------------

    def _set_issued(self) -> None:
        with self._lock:
            self._issued.set()

    def _finish(self, exception: BaseException | None) -> bool:
        """Finish once; False (and nothing happens) if it had already finished (a request the watchdog
        gave up on, landing after all)."""
        with self._lock:
            if self._finished.is_set():
                return False
            self._issued.set()
            callbacks = self._finish_locked(exception)
        for fn in callbacks:
            fn(self)
        return True


@dataclass(frozen=True)
class PumpStatistics:
    delivered: int  # completions handed to the loop
    loop_wakeups: int  # call_soon_threadsafe calls made (< delivered when bursts were batched)


class InterruptPump:
    """Runs callbacks of finished completions on one event loop, through its `call_soon_threadsafe`."""

    def __init__(self, call_soon_threadsafe: Callable[[Callable[[], None]], Any]) -> None:
        self._call = call_soon_threadsafe
        self._lock = threading.Lock()
        self._queue: list[tuple[Callable[[Completion], None], Completion]] = []
        self._delivered = 0
        self._wakeups = 0

    def watch(self, completion: Completion, on_loop: Callable[[Completion], None]) -> None:
        """Run on_loop(completion) on the loop once the completion finishes."""
        completion.add_done_callback(lambda c: self._push(on_loop, c))

    def _push(self, fn: Callable[[Completion], None], completion: Completion) -> None:
        with self._lock:
            self._queue.append((fn, completion))
            if len(self._queue) > 1:
                return  # a drain is already scheduled and will take this one too
            self._wakeups += 1
        self._call(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._queue = self._queue, []
            self._delivered += len(items)
        for fn, completion in items:
            fn(completion)

    def statistics(self) -> PumpStatistics:
        with self._lock:
            return PumpStatistics(delivered=self._delivered, loop_wakeups=self._wakeups)


def run_async(main: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine to completion on a new event loop: uvloop's when installed, else asyncio's."""
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()
