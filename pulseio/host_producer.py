"""HostProducer: the CPU backend's stand-in for the GPU publish kernel of a doorbell ring."""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np

from .doorbell import Doorbell


class HostProducer:
    """The CPU backend's stand-in for the publish kernel: a thread that runs posted publishes in post
    order (as a stream runs kernels), each claiming its seq from the ring's counter."""

    def __init__(self, doorbell: Doorbell) -> None:
        self._doorbell = doorbell
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="pulseio-host-producer", daemon=True)
        self._thread.start()
        self.watermark = 0  # what the device completion word would hold
        self.device_word = 0  # there is none

    def post(self, ids: Any, slots: Any, count: Any, tag: int, stream: Any = None) -> None:
        """ids, slots: [>= count] integer ids, host (torch CPU tensor or numpy); count: int or [1] array."""
        self._queue.put((ids, slots, count, tag))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, threading.Event):
                item.set()
                continue
            ids, slots, count, tag = item
            n = count if isinstance(count, int) else int(np.asarray(count).reshape(-1)[0])
            self._doorbell.publish(np.asarray(ids), np.asarray(slots), tag=tag, count=n)

    def signal(self, events: list[Any], watermark: int) -> None:
        self.watermark = max(self.watermark, watermark)

    def release_all(self) -> None:
        pass

    def drain_sync(self) -> None:
        """Wait until every posted publish has run."""
        done = threading.Event()
        self._queue.put(done)
        done.wait()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
