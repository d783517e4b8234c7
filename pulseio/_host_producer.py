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

    waits_on_device = False  # there is no device: Completion.device_wait waits on the host
    ids_mirror = mirror_heads = None  # no device memory to mirror ids into

    def __init__(self, doorbell: Doorbell) -> None:
        self._doorbell = doorbell
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="pulseio-host-producer", daemon=True)
        self._thread.start()

    def post(self, ids: Any, slots: Any, count: Any, tag: int, stream: Any = None, seq_out: Any = None) -> None:
        """ids, slots: [>= count] integer ids, host (torch CPU tensor or numpy); count: int or [1] array.
        seq_out is for captured device waits, which need a device."""
        if seq_out is not None:
            raise NotImplementedError("the host backend has no device: a publish cannot feed a captured device wait")
        self._queue.put((ids, slots, count, tag))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, threading.Event):
                item.set()
                continue
            ids, slots, count, tag = item
            n = count if isinstance(count, int) else int(np.asarray(count).reshape(-1)[0])
            self._doorbell.publish(np.asarray(ids), np.asarray(slots), tag=tag, count=n)

    def check_ids(self, name: str, ids: Any) -> None:
        """Any host integer ids do: the producer thread copies them (make_plan validates them later)."""

    def wait_word(self, stream: Any, address: int, value: int) -> None:
        raise NotImplementedError("the host backend has no device to wait on")

    def wait_seq(self, stream: Any, seq_at: int, words_base: int, words: int) -> None:
        raise NotImplementedError("the host backend has no device to wait on")

    def drain_sync(self, timeout: float) -> bool:
        """Wait up to `timeout` s until every posted publish has run; False if they have not."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
