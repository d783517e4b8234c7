"""Where the main thread's time goes in a serving round, by phase. No torch.

A round's phases, in order: `outer` (the replay's bookkeeping of the round before, arrivals, the outer
scheduler's decisions, moves and admissions with their handed-in KV), `schedule` (each engine's next work,
prefills run), `prepare` (the decode batches built: metadata written, a step due for capture captured),
`launch` (the pieces enqueued; under IRQ also the polling of recalls), `pace` (under IRQ on a GPU, the part of
the launch spent napping in the pacer, waiting for the GPU to catch up: what the host could do more of without
slowing the GPU), `tokens` (waiting for the round's tokens) and `commit` (tokens appended, finished requests
retired).
Tokens come back once the GPU has run the whole round, so everything from `commit` to the first piece
enqueued by the next `launch` is time the GPU stands idle.
"""

from __future__ import annotations

import time

PHASES = ("outer", "schedule", "prepare", "launch", "pace", "tokens", "commit")


class HostTimes:
    """Seconds the main thread spent in each phase (`PHASES`), summed over rounds: `start` where a phase
    begins after a pause, `lap(phase)` where one ends."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._t = time.perf_counter()

    def start(self) -> None:
        self._t = time.perf_counter()

    def exclude(self, seconds: float) -> None:
        """`seconds` just spent on no phase (measuring the run) stay out of the phase running now."""
        self._t += seconds

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] += now - self._t
        self._t = now

    def move(self, seconds: float, source: str, to: str) -> None:
        """`seconds` counted in phase `source` belong to phase `to` (the pacer's naps inside `launch`)."""
        self.seconds[source] -= seconds
        self.seconds[to] += seconds

    def ms_per_round(self, rounds: int) -> dict[str, float]:
        """Each phase's mean milliseconds a round (zeros before the first round)."""
        return {phase: s / rounds * 1e3 if rounds else 0.0 for phase, s in self.seconds.items()}
