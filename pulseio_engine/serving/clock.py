"""The replay's clock: wall time (a GPU serving in real time) or virtual time (a CPU, or any run that should
not sleep). No torch.

Both advance by the measured duration of every round. They differ when the engine is idle: the wall clock
sleeps until the next arrival; the virtual clock jumps there. On a CPU the rounds are measured as they run,
so arrivals meet an engine as slow as the CPU is: scale the trace's time (`--time-scale`) to match.
"""

from __future__ import annotations

import time
from enum import Enum


class ClockKind(Enum):
    """How the replay's time passes (`--clock`)."""

    WALL = "wall"          # real time: idle means sleeping until the next arrival
    VIRTUAL = "virtual"    # rounds' measured time; idle means jumping to the next arrival


class Clock:
    def __init__(self, kind: ClockKind) -> None:
        self.kind = kind
        self._start = time.perf_counter()
        self._virtual = 0.0

    def now(self) -> float:
        """Seconds since the replay began."""
        return time.perf_counter() - self._start if self.kind is ClockKind.WALL else self._virtual

    def ran(self, seconds: float) -> None:
        """A round took `seconds` (already passed on the wall clock)."""
        if self.kind is ClockKind.VIRTUAL:
            self._virtual += seconds

    def exclude(self, seconds: float) -> None:
        """`seconds` just passed on the wall doing no serving (measuring it): keep them off the clock."""
        if self.kind is ClockKind.WALL:
            self._start += seconds

    def idle_until(self, t: float) -> None:
        """Nothing to run before `t`: sleep (wall) or jump (virtual)."""
        if self.kind is ClockKind.WALL:
            time.sleep(max(0.0, t - self.now()))
        else:
            self._virtual = max(self._virtual, t)
