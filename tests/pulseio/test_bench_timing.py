"""The bench's sustained rate never beats the device it measures, however few transfers it times.

The device and the host are simulated on a virtual clock (the timing module's `time` is replaced),
so the figures are exact and the test does not depend on how busy the machine running it is."""

from __future__ import annotations

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
