"""Timing helpers shared by the suite: device sync and back-to-back sustained rates."""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

import torch

from ..transfer import Transfer


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sustained_seconds(submit: Callable[[int], Transfer], reps: int, window: int, runs: int = 3) -> float:
    """Wall seconds per transfer of back-to-back transfers, at most `window` in flight.

    Long enough measurements are split into `runs` independent runs (each fills and drains the
    window) and the median is returned: one pause of the process (a garbage collection, a page
    fault) then spoils one run, not the figure.
    """
    if reps < runs * 4 * window:
        runs = 1
    per_run = reps // runs
    return statistics.median(_one_run(submit, per_run, window, start=k * per_run) for k in range(runs))


def _one_run(submit: Callable[[int], Transfer], reps: int, window: int, start: int) -> float:
    in_flight: deque[Transfer] = deque()
    t0 = time.perf_counter()
    for i in range(start, start + reps):
        if len(in_flight) >= window:
            in_flight.popleft().wait()
        in_flight.append(submit(i))
    while in_flight:
        in_flight.popleft().wait()
    return (time.perf_counter() - t0) / reps


def warm_up(submit: Callable[[int], Transfer], seconds: float) -> None:
    """Transfers one at a time for `seconds` (at least two): on the H200 VM the first tens of
    milliseconds after an engine pinned its buffers sometimes ran at a third of the rate."""
    until, i = time.perf_counter() + seconds, 0
    while i < 2 or time.perf_counter() < until:
        submit(i).wait()
        i += 1


def sustained_while(
    submit: Callable[[int], Transfer], wait_end: Callable[[], None], window: int, nbytes: int,
) -> tuple[int, float]:
    """Back-to-back transfers (at most `window` in flight) until `wait_end()` returns (a GEMM's end).

    Returns (bytes, seconds) of the transfers that landed before the end: their bytes, and the time
    from the first submit to the last of their landings. The ones still in flight at the end are
    drained but not counted: they land on an idle GPU. If none landed in time (a strategy slower
    than the run), the first transfer is counted, to its landing.

    Two helper threads take the times, so that a submit that blocks (cuMemcpyBatchAsync waits for
    room in the stream's queue) delays neither: one waits for the end, one for each transfer in turn.
    """
    ended, end_at = threading.Event(), [0.0]
    landings: list[float] = []
    watch: queue.SimpleQueue[Transfer | None] = queue.SimpleQueue()

    def watch_end() -> None:
        wait_end()
        end_at[0] = time.perf_counter()
        ended.set()

    def watch_landings() -> None:
        while (transfer := watch.get()) is not None:
            transfer.wait()
            landings.append(time.perf_counter())

    threads = [threading.Thread(target=watch_end), threading.Thread(target=watch_landings)]
    for thread in threads:
        thread.start()
    in_flight: deque[Transfer] = deque()
    t0, i = time.perf_counter(), 0
    try:
        while not ended.is_set():
            if len(in_flight) >= window:
                in_flight.popleft().wait()
            in_flight.append(transfer := submit(i))
            watch.put(transfer)
            i += 1
        while in_flight:
            in_flight.popleft().wait()
    finally:
        watch.put(None)
        for thread in threads:
            thread.join()
    counted = [t for t in landings if t <= end_at[0]] or landings[:1]
    return len(counted) * nbytes, (counted[-1] - t0 if counted else 0.0)


def median_latency_us(submit: Callable[[int], Transfer], reps: int) -> float:
    """Median submit -> landed time of one transfer alone, in microseconds."""
    samples: list[float] = []
    for i in range(reps):
        t0 = time.perf_counter()
        submit(i).wait()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def reps_for(nbytes: int, *, target_bytes: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, target_bytes // max(nbytes, 1)))


def copy_seconds(copy: Callable[[], object], device: torch.device, reps: int) -> float:
    """Seconds per call of `copy` over `reps` back-to-back calls (after one warm-up)."""
    copy()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        copy()
    synchronize(device)
    return (time.perf_counter() - start) / reps
