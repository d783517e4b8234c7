"""The bench's sustained rate never beats the device it measures, however few transfers it times."""

from __future__ import annotations

import time

import pytest

from pulseio.bench.timing import sustained_seconds

_SERVICE_S = 200e-6  # a serial device: each transfer lands this long after the previous one


class _Landing:
    def __init__(self, at: float) -> None:
        self.at = at

    def wait(self) -> None:
        while time.perf_counter() < self.at:
            pass


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.parametrize("reps", [3, 10, 400])
def test_sustained_rate_matches_a_serial_device(reps: int) -> None:
    last = [0.0]

    def submit(_: int) -> _Landing:
        last[0] = max(time.perf_counter(), last[0]) + _SERVICE_S
        return _Landing(last[0])

    seconds = sustained_seconds(submit, reps, window=8)
    assert _SERVICE_S * 0.98 <= seconds <= _SERVICE_S * 1.5, seconds


@pytest.mark.parametrize("reps", [10, 400])
def test_sustained_rate_counts_a_slow_submitter(reps: int) -> None:
    """When issuing costs more than copying, transfers land in bursts; the rate is still the issue rate."""

    def submit(_: int) -> _Landing:
        _spin(_SERVICE_S)  # the host's cost of one submit
        return _Landing(time.perf_counter() + _SERVICE_S / 4)

    seconds = sustained_seconds(submit, reps, window=8)
    assert _SERVICE_S * 0.98 <= seconds <= _SERVICE_S * 1.5, seconds
