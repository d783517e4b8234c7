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


def sustained_seconds(submit: Callable[[int], Transfer], reps: int, window: int, chunks: int = 5) -> float:
    """Wall seconds per transfer over `reps` back-to-back transfers, at most `window` in flight.

    The median over `chunks` consecutive stretches of the run: one pause of the process (a garbage
    collection, a page fault) lands in one stretch and does not decide the figure.
    """
    per_chunk = max(1, reps // max(1, chunks))
    in_flight: deque[Transfer] = deque()
    marks = [time.perf_counter()]
    finished = 0

    def retire() -> None:
        nonlocal finished
        in_flight.popleft().wait()
        finished += 1
        if finished % per_chunk == 0:
            marks.append(time.perf_counter())

    for i in range(reps):
        if len(in_flight) >= window:
            retire()
        in_flight.append(submit(i))
    while in_flight:
        retire()
    return statistics.median(b - a for a, b in zip(marks, marks[1:])) / per_chunk


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
