"""ManualDoorbell: a ring a test writes step by step; DelayedBackend: completions in random order."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import numpy as np

from .._native.layout import SEQ
from ..config import DmaConfig
from ..doorbell import Doorbell, RingLayout
from ..host_backend import HostBackend
from ..memory import DevicePool, HostPool


class ManualDoorbell(Doorbell):
    """A Doorbell in plain host memory whose producer is the test: publish any seq in any order,
    leave a slot half-written, or lap the reader, then check what `poll_nowait` reports."""

    def __init__(self, capacity: int = 8, max_blocks: int = 16, **kwargs: Any) -> None:
        layout = RingLayout(capacity, max_blocks)
        super().__init__(HostBackend().alloc_host(layout.nbytes, label="manual doorbell"), layout, **kwargs)

    def slot_seq(self, seq: int) -> int:
        """The seq word of the slot `seq` maps to (negative while a write is in progress)."""
        return int(self.words[((seq - 1) % self.layout.capacity) * self.layout.slot_words + SEQ])

    def begin_write(self, seq: int) -> None:
        """Mark seq's slot busy, as a producer does before writing the payload (and stop there)."""
        self.words[((seq - 1) % self.layout.capacity) * self.layout.slot_words + SEQ] = -seq

    def publish_simple(self, seq: int, n: int = 1, *, tag: int | None = None) -> np.ndarray:
        """Publish seq with ids seq*1000 + [0, n) and slots [0, n); returns the ids."""
        ids = seq * 1000 + np.arange(n, dtype=np.int64)
        self.publish_at(seq, ids, np.arange(n, dtype=np.int64), tag=seq if tag is None else tag)
        return ids


class DelayedBackend(HostBackend):
    """HostBackend whose routes sleep a random 0..max_delay_s before each issue: with several I/O
    workers, requests land in random order (what the wait words and the pumps must survive)."""

    def __init__(self, max_delay_s: float = 2e-3, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self.max_delay_s = max_delay_s

    def delay(self) -> float:
        with self._rng_lock:
            return self._rng.uniform(0, self.max_delay_s)

    def open_routes(self, host: HostPool, device: DevicePool, config: DmaConfig, reclaim: Any) -> Any:
        routes = super().open_routes(host, device, config, reclaim)
        issue = routes.issue

        def delayed_issue(*args: Any, **kwargs: Any) -> Any:
            time.sleep(self.delay())
            return issue(*args, **kwargs)

        routes.issue = delayed_issue  # type: ignore[method-assign]
        return routes
