"""The bench's sustained rate never beats the device it measures, however few transfers it times.

The device and the host are simulated on a virtual clock (the timing module's `time` is replaced),
so the figures are exact and the test does not depend on how busy the machine running it is."""

from __future__ import annotations

import threading
import time
import types

import pytest

from pulseio.bench import timing
from pulseio.bench.timing import sustained_seconds

_SERVICE_S = 200e-6  # a serial device: each transfer lands this long after the previous one


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _Landing:
    def __init__(self, clock: _Clock, at: float) -> None:
        self.clock, self.at = clock, at

    def wait(self) -> None:
        self.clock.now = max(self.clock.now, self.at)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    return clock


@pytest.mark.parametrize("reps", [3, 10, 400])
def test_sustained_rate_matches_a_serial_device(clock: _Clock, reps: int) -> None:
    last = [0.0]

    def submit(_: int) -> _Landing:
        clock.now += 1e-6  # the host's cost of one submit
        last[0] = max(clock.now, last[0]) + _SERVICE_S
        return _Landing(clock, last[0])

    seconds = sustained_seconds(submit, reps, window=8)
    assert _SERVICE_S <= seconds <= _SERVICE_S * 1.01, seconds


@pytest.mark.parametrize("reps", [10, 400])
def test_sustained_rate_counts_a_slow_submitter(clock: _Clock, reps: int) -> None:
    """When issuing costs more than copying, transfers land in bursts; the rate is still the issue rate."""

    def submit(_: int) -> _Landing:
        clock.now += _SERVICE_S  # the host's cost of one submit
        return _Landing(clock, clock.now + _SERVICE_S / 4)

    seconds = sustained_seconds(submit, reps, window=8)
    assert _SERVICE_S <= seconds <= _SERVICE_S * 1.25, seconds



class _PacedDevice:
    """A serial device in real time: a transfer takes `before` while the GEMM runs and `after` once it
    has ended. Landing waits sleep; the end is a sleep too, as a GEMM's synchronize would be. The pace
    switches when that sleep returns, not at its due time: on a busy machine the sleep overshoots, and
    a transfer started in the overshoot must not count as one made under load. The run's `end_s` counts
    from the first submit: a loaded machine may start the submitting loop late, and a run that ended
    before it began would test nothing (seen: a 5 ms run over before the first submit, 0 bytes)."""

    def __init__(self, end_s: float, before: float, after: float) -> None:
        self.end_s, self.before, self.after = end_s, before, after
        self.started = threading.Event()
        self.ended = False
        self.last = 0.0
        self.submitted = 0

    def submit(self, _: int) -> _Sleeper:
        start = max(time.perf_counter(), self.last)
        if not self.started.is_set():
            self.end_at = start + self.end_s
            self.started.set()
        self.last = start + (self.after if self.ended else self.before)
        self.submitted += 1
        return _Sleeper(self.last)

    def wait_end(self) -> None:
        self.started.wait()
        _Sleeper(self.end_at).wait()
        self.ended = True


class _Sleeper:
    def __init__(self, at: float) -> None:
        self.at = at

    def wait(self) -> None:
        time.sleep(max(0.0, self.at - time.perf_counter()))


def test_rate_while_loaded_leaves_out_the_drained_tail() -> None:
    """Transfers drained after the GEMM ended run at the idle GPU's pace: they must not lift the rate.
    (Real time: a busy machine only makes sleeps longer, which cannot pull the rate below the bound.)"""
    before, nbytes = 4e-3, 1 << 20
    device = _PacedDevice(end_s=0.1, before=before, after=before / 8)
    moved, seconds = timing.sustained_while(device.submit, device.wait_end, window=8, nbytes=nbytes)
    assert moved % nbytes == 0 and moved >= nbytes
    assert seconds / (moved // nbytes) >= before * 0.99  # the tail at before/8 would pull it far below
    assert device.submitted > moved // nbytes  # the window in flight at the end was drained, not counted


def test_rate_while_loaded_times_a_strategy_slower_than_the_run() -> None:
    """Nothing lands before the run ends: the first transfer is counted, to its landing."""
    device = _PacedDevice(end_s=0.005, before=0.05, after=0.05)
    moved, seconds = timing.sustained_while(device.submit, device.wait_end, window=8, nbytes=100)
    assert moved == 100
    assert seconds >= 0.05 * 0.99
