"""Completions and how they reach their waiters: host threads, GPU streams and event loops.

A `Completion` is the handle of one recall request. It finishes exactly once, on a pulseio thread
(the DMA completion thread, or the poller for a request that fails before any copy). From there:

* host threads: `done()`, `wait(timeout)`, `exception()`;
* GPU streams: `device_wait(stream)` enqueues a wait on the runtime's completion word. Requests
  land in any order, so the word never holds "the last seq that landed" but the *watermark*
  (`CompletionOrder`): the highest seq such that it and every seq before it landed or failed. A
  stream waiting for `word >= seq` is therefore released only once seq's data is there;
* event loops: `await completion`. The `InterruptPump` of that loop is the one path from a
  finished completion to a resolved future; it knows nothing of asyncio beyond the
  `call_soon_threadsafe` it was given, and a burst of completions costs the loop one wake-up.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any

from ._once import FinishOnce
from .errors import PulseInternalError


class Completion(FinishOnce):
    """One recall request: data landed (`done()` and no exception) or failed, never both.

    `wait(timeout)` returning False changes nothing: the copy may still be running, and every
    buffer it may write stays reserved until it has finished.
    """

    def __init__(self, *, seq: int, tag: int | None, device_waiter: Callable[[Completion, Any], None],
                 awaiter: Callable[[Completion], Any]) -> None:
        super().__init__()
        self.seq = seq
        self.tag = tag  # the request tag (from the caller, or from the payload once read)
        self.posted_ns = time.perf_counter_ns()  # when the request was posted (or expected)
        self.published_ns: int | None = None  # the producer's stamp (%globaltimer on the GPU)
        self.seen_ns: int | None = None  # perf_counter_ns when the poller read the request
        self.landed_ns: int | None = None  # perf_counter_ns when pulseio saw the data land
        self.num_blocks = 0
        self.nbytes = 0
        self.transfer: Any = None  # the pulseio.Transfer carrying it, once submitted
        self._device_waiter = device_waiter
        self._awaiter = awaiter

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._exception else "done")
        return f"<Completion seq={self.seq} tag={self.tag!r} {self.num_blocks} blocks {state}>"

    def device_wait(self, stream: Any = None) -> None:
        """Make a CUDA stream (default: current) wait until this request's data has landed. Never waits
        on the host. The wait is released for a failed request too (a stream must not hang), so check
        `exception()` on the host before trusting the destination slots.
        On the host backend this waits on the host, as `Transfer.device_wait` does."""
        if self._exception is not None:
            raise self._exception
        self._device_waiter(self, stream)

    def __await__(self) -> Generator[Any, None, Completion]:
        """Await until done; returns self or raises the request's error. Cancelling the await leaves
        the request running."""
        yield from self._awaiter(self).__await__()
        return self

    # -- called by pulseio's threads -----------------------------------------------------------

    def _finish(self, exception: BaseException | None) -> None:
        with self._lock:
            self.landed_ns = time.perf_counter_ns()
            callbacks = self._finish_locked(exception)
        for fn in callbacks:
            fn(self)


class CompletionOrder:
    """The watermark of requests finishing in any order: `ready(seq, token)` returns the tokens of the
    seqs it newly covers, in seq order (the caller makes the device wait for each, then writes the
    watermark). Not thread-safe: the caller holds a lock across `ready` and the writes it makes."""

    def __init__(self, start: int = 0) -> None:
        self.watermark = start
        self._ready: dict[int, Any] = {}

    def ready(self, seq: int, token: Any = None) -> list[Any]:
        if seq <= self.watermark or seq in self._ready:
            raise PulseInternalError(f"seq {seq} marked ready twice (watermark {self.watermark})")
        self._ready[seq] = token
        covered = []
        while self.watermark + 1 in self._ready:
            self.watermark += 1
            covered.append(self._ready.pop(self.watermark))
        return covered

    @property
    def waiting(self) -> int:
        """Seqs ready but held back behind an earlier one still in flight."""
        return len(self._ready)


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
