"""The garbage collector's pauses in a serving loop: `frozen_heap` keeps them short, `GCPauses` counts them.

A collection stops every Python thread: the loop enqueuing the next GPU work and pulseio's poller handing
requests to the copier. A full (generation 2) collection walks every object the process tracks, and with
torch, Triton and the captured steps loaded that is hundreds of thousands to millions of them: tens to
hundreds of milliseconds during which the GPU drains its queue and idles. What a server builds before it
takes traffic (modules, kernels, graphs, pools) lives as long as the process, so `frozen_heap` collects once
and moves all of it to the permanent generation (`gc.freeze`), which no later collection walks; a full
collection then costs what the loop itself allocated since.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType

log = logging.getLogger(__name__)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Within the block, every object alive on entry is exempt from collection (`gc.collect()`, then
    `gc.freeze()`); on leaving, they are collectable again (`gc.unfreeze()`). Enter it after the warm-up, around
    the loop. The collector is the process's: nest none, and enter it where the process's main loop runs."""
    gc.collect()
    gc.freeze()
    log.info("%d objects frozen out of the garbage collector until the block ends", gc.get_freeze_count())
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass(frozen=True)
class GCPauseStatistics:
    """The collections `GCPauses` saw: how many of each generation (0, 1, 2), their pauses summed, the longest."""

    collections: tuple[int, int, int]
    paused_s: float
    longest_s: float


class GCPauses:
    """Counts every garbage collection while entered (a `gc.callbacks` entry), by generation, with its pause.
    Cheap enough to keep on: two clock reads a collection."""

    def __init__(self) -> None:
        self._collections = [0, 0, 0]
        self._paused_s = 0.0
        self._longest_s = 0.0
        self._started = 0.0

    def __enter__(self) -> GCPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
            return
        pause = now - self._started
        self._collections[info["generation"]] += 1
        self._paused_s += pause
        self._longest_s = max(self._longest_s, pause)

    def statistics(self) -> GCPauseStatistics:
        g0, g1, g2 = self._collections
        return GCPauseStatistics((g0, g1, g2), self._paused_s, self._longest_s)
