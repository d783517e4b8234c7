"""Timing helpers shared by the suite: device sync and back-to-back sustained rates."""

from __future__ import annotations

import statistics
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


def copy_seconds(copy: Callable[[], None], device: torch.device, reps: int) -> float:
    """Seconds per call of `copy` over `reps` back-to-back calls (after one warm-up)."""
    copy()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        copy()
    synchronize(device)
    return (time.perf_counter() - start) / reps
