"""`ResidentCopier._check_running`, the late waiter's liveness check on the GPU copier, on a stand-in for
its stream and control line (no GPU): a generation that stops while the check runs is relaunched, not
reported as a copier that exited without its stop handshake."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pulseio._native import task_ring as tr
from pulseio.errors import PulseInternalError

pytestmark = pytest.mark.needs_package("cuda.bindings")   # pulseio._cuda.resident drives the GPU through it


class _Stream:
    """`query()` answers idle; `on_query` runs first (the kernel doing something meanwhile)."""

    def __init__(self, on_query=lambda: None) -> None:  # noqa: ANN001
        self.on_query = on_query

    def query(self) -> bool:
        self.on_query()
        return True


def _copier(stream: _Stream, *, gen: int, stopped: int):  # noqa: ANN202 (ResidentCopier, imported here)
    from pulseio._cuda.resident import ResidentCopier

    copier = object.__new__(ResidentCopier)      # only what _check_running touches
    launched: list[int] = []
    copier._launch_lock = threading.Lock()
    copier._ctrl = np.zeros(tr.CTRL_WORDS, np.int64)
    copier._ctrl[tr.CTRL_STOPPED] = stopped
    copier._gen = gen
    copier.stream = stream
    copier._launch = lambda *args: launched.append(copier._gen)
    copier.landed = lambda seq: False
    return copier, launched


def test_a_generation_stopping_during_the_check_is_relaunched() -> None:
    stream = _Stream()
    copier, launched = _copier(stream, gen=3, stopped=2)
    stream.on_query = lambda: copier._ctrl.__setitem__(tr.CTRL_STOPPED, 3)   # generation 3 stops and exits
    copier._check_running(7)
    assert launched == [3]


def test_an_idle_stream_without_the_stop_handshake_is_an_internal_error() -> None:
    copier, launched = _copier(_Stream(), gen=3, stopped=2)
    with pytest.raises(PulseInternalError, match=r"^resident task 7 was posted, no kernel is running"):
        copier._check_running(7)
    assert launched == []
