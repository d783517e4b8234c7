"""`--gil-switch-us`, the same for `bench` and `replay`: the interpreter's GIL switch interval while the engine runs.
pulseio's poller takes the GIL between recalls, so a stretch of the main thread's pure Python (arming a step's
recalls, committing a round's tokens) holds a recall published meanwhile back for up to the interval
(`pulseio.gil_switch_interval`); Python's own is 5 ms."""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager, nullcontext

import pulseio
from pulseio.cliargs import UsageError, float_at_least

GIL_SWITCH_US = 100.0


def add_gil_switch_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--gil-switch-us", type=float_at_least(0.0), default=GIL_SWITCH_US, metavar="US",
                        help="the interpreter's GIL switch interval while the engine runs: pulseio's poller takes "
                             "the GIL between recalls, so the main thread's pure Python holds a recall back for up "
                             f"to this long (0: leave the interpreter's, 5000 by default; default: {GIL_SWITCH_US:g})")


def gil_switch_s(prog: str, us: float) -> float | None:
    """`--gil-switch-us` in seconds; None for 0 (the interpreter's left as it is)."""
    if us > 1e6:
        raise UsageError(prog, f"--gil-switch-us {us:g} is over a second; the interpreter's default is 5000 and the "
                               f"engine's {GIL_SWITCH_US:g} (0 leaves the interpreter's)")
    return None if us == 0 else us * 1e-6


def gil_switch_us(seconds: float | None) -> float | None:
    """The interval as a run's record states it: microseconds, rounded to a nanosecond (None: the interpreter's)."""
    return None if seconds is None else round(seconds * 1e6, 3)


def gil_switch(seconds: float | None) -> AbstractContextManager[None]:
    """`pulseio.gil_switch_interval(seconds)`, or nothing for None."""
    return nullcontext() if seconds is None else pulseio.gil_switch_interval(seconds)
