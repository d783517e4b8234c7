"""A runtime serving requests in a fresh process with an empty numba cache (run by test_no_compile_in_service.py):
prints one JSON line of every numba compile after `open_runtime` returned, with the thread that made it.

    NUMBA_CACHE_DIR=$(mktemp -d) python compile_watch_case.py

A first call of a compiled function compiles it, for seconds, holding the GIL; on the poller's or an I/O
worker's thread that is seconds for which no request reaches a copier, which a device wait's watchdog
(10 s) can see as a request that never landed.
"""

from __future__ import annotations

import json
import threading

import numpy as np
from numba.core import dispatcher

import pulseio

compiles: list[list[str]] = []
watching = False
_compile = dispatcher.Dispatcher.compile


def _watched(self, sig):  # noqa: ANN001, ANN202
    if watching:
        compiles.append([threading.current_thread().name, f"{self.py_func.__module__}.{self.py_func.__qualname__}"])
    return _compile(self, sig)


dispatcher.Dispatcher.compile = _watched


def main() -> None:
    global watching
    config = pulseio.RuntimeConfig(device="cpu", host_blocks=64, device_slots=16, block_bytes=64, ring_slots=8,
                                   max_blocks_per_request=8)
    with pulseio.open_runtime(config) as rt:
        watching = True
        for step in range(4):
            ids, slots = np.arange(step, step + 8, dtype=np.int64), np.arange(8, dtype=np.int64)
            rt.post_recall(host_ids=ids, device_slots=slots, tag=step).wait(10)       # doorbell: the fast lane
            rt.post_recall(host_ids=ids, device_slots=slots, count=3).wait(10)        # part of the ids
            rt.recall(host_ids=ids[::2], device_slots=slots[:4]).wait(10)             # direct, strided ids
            rt.recall(host_ids=ids.astype(np.int32), device_slots=slots).wait(10)     # direct, int32 ids
            for strategy in (pulseio.Strategy.RESIDENT, pulseio.Strategy.GATHER_DMA):
                rt.post_recall(host_ids=ids, device_slots=slots, strategy=strategy).wait(10)
            try:
                rt.post_recall(host_ids=ids + 100, device_slots=slots).wait(10)       # refused by the poller
            except pulseio.PulseError:
                pass
        watching = False
    print(json.dumps(compiles))


if __name__ == "__main__":
    main()
