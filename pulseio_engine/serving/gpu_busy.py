"""GPU busy fraction from the GPU's own timeline: torch.profiler's CUDA activity over sampled windows of rounds.

Busy is the union of the model's kernels' intervals over the window (from its first kernel's start to its
last kernel's end), so overlapping kernels count once. pulseio's own kernels are left out: the resident
copier and the device waits spin while they hold the GPU (a wait kernel is the GPU idle, waiting for a
recall), and the publish only hands a recall's block list to the copier. Profiling costs time, so only every
`every`-th window of `rounds` rounds is profiled. A window is walked as soon as it closes: on a GPU, a closed
profiler's results do not survive the next window (read after it, every event's time is zero). The walk holds
the host for a while, so `after_round` returns the seconds it took, which the replay keeps off its clock, as it
does the seconds `before_round` spends starting the profiler.
`fraction()` is None on a CPU. With `timeline_dir`, the same windows also record the host's side (CPU
activity, on a CPU too) and are written there as Chrome traces, one file a window, to be read in Perfetto or
`chrome://tracing`: where the GPU stands idle, and what the host did then. Recording the host's calls slows
the host in those windows, so a run with timelines reads a lower busy fraction than one without.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

PULSEIO_KERNELS = ("resident_copy", "wait_word", "wait_seq", "publish_kernel")


def is_pulseio_kernel(name: str) -> bool:
    """A kernel of pulseio's (`PULSEIO_KERNELS`): the GPU is not busy with the model while it runs."""
    return any(k in name for k in PULSEIO_KERNELS)


def idle_gaps(intervals: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The parts of [start, end] that no interval of `intervals` ([(start, end)], any order, overlapping) covers,
    in order."""
    gaps, reach = [], start
    for lo, hi in sorted(intervals):
        if lo > reach:
            gaps.append((reach, min(lo, end)))
        reach = max(reach, hi)
        if reach >= end:
            break
    if reach < end:
        gaps.append((reach, end))
    return [(lo, hi) for lo, hi in gaps if hi > lo]


def busy_fraction(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Covered length of `intervals` ([(start, end)], any order, overlapping) within [start, end], over its length."""
    if end <= start:
        return 0.0
    return 1.0 - sum(hi - lo for lo, hi in idle_gaps(intervals, start, end)) / (end - start)


class BusyMeter:
    """Profiles `rounds` rounds out of every `every` on a GPU; `fraction()` over the windows profiled."""

    def __init__(self, device: str, *, every: int = 50, rounds: int = 5, timeline_dir: Path | None = None) -> None:
        self.gpu = device.startswith("cuda")
        self.enabled = self.gpu or timeline_dir is not None
        self.every, self.rounds = every, min(rounds, every)
        self.timeline_dir = timeline_dir
        self.timelines: list[Path] = []                   # the traces written so far
        self._round = 0
        self._prof: Any = None
        self._first = 0                                   # the open window's first round
        self._windows: list[tuple[float, float]] = []     # (busy seconds, window seconds)

    def before_round(self) -> float:
        """-> seconds spent opening a window that starts with this round (0.0 if none does): starting the
        profiler holds the host (the first start loads CUPTI), so the replay keeps them off its clock too."""
        if self.enabled and self._prof is None and self._round % self.every == self.every - self.rounds:
            import torch

            t0 = time.perf_counter()
            activity = torch.profiler.ProfilerActivity
            self._prof = torch.profiler.profile(activities=[activity.CUDA] * self.gpu
                                                + [activity.CPU] * (self.timeline_dir is not None))
            self._prof.start()
            self._first = self._round
            return time.perf_counter() - t0
        return 0.0

    def after_round(self) -> float:
        """-> seconds spent closing and walking a window that ended with this round (0.0 if none did)."""
        self._round += 1
        if self._prof is not None and self._round % self.every == 0:
            return self._close()
        return 0.0

    def _close(self) -> float:
        t0 = time.perf_counter()
        prof, first, last = self._prof, self._first, self._round - 1
        self._prof = None
        prof.stop()
        if self.timeline_dir is not None:
            path = self.timeline_dir / f"rounds-{first}-{last}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(path))
            self.timelines.append(path)
        self._take(prof)
        return time.perf_counter() - t0

    def stop(self) -> None:
        """After the last round: a window still open (the replay ended inside it) is closed and walked. A
        profiler left running would be torn down at the interpreter's exit, which can crash it."""
        if self._prof is not None:
            self._close()

    @property
    def windows(self) -> list[tuple[float, float]]:
        """(busy seconds, window seconds) of each profiled window with a model kernel in it."""
        return self._windows

    def _take(self, prof: Any) -> None:
        import torch

        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith(("Memcpy", "Memset", "[memory]"))]
        if not kernels:
            return
        start = min(e.time_range.start for e in kernels)
        end = max(e.time_range.end for e in kernels)
        model = [(e.time_range.start, e.time_range.end) for e in kernels
                 if not is_pulseio_kernel(e.name)]
        window = (end - start) / 1e6
        self._windows.append((busy_fraction(model, start, end) * window, window))

    def fraction(self) -> float | None:
        windows = self.windows
        total = sum(w for _, w in windows)
        return None if not total else sum(b for b, _ in windows) / total
