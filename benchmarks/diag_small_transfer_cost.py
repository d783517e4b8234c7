"""What bounds a small recall: the host's Python per transfer, or the GPU? For 64 and 512 blocks of
8 KiB, RESIDENT and ZERO_COPY: the sustained time per transfer at 1..32 in flight, and how much of it
the submitting thread spends inside `recall` and inside `wait`. First, on the CPU backend with the
copy stubbed out (each task lands as it is posted), the host's cost alone.

    PYTHONPATH=. python benchmarks/diag_small_transfer_cost.py           (CPU part only)
    PYTHONPATH=. python benchmarks/diag_small_transfer_cost.py --gpu     (both; ~20 s on the H200)
"""

from __future__ import annotations

import argparse
import time
from collections import deque

import numpy as np

import pulseio
from pulseio import DevicePool, DmaEngine, HostBackend, HostPool, Strategy
from pulseio.bench.timing import sustained_seconds
from pulseio._resident import HostResidentCopier, TaskRing

BLOCK = 8 << 10


class _StubbedCopy:
    """The CPU backend's RESIDENT route with no server: every post marks its task landed at once."""

    def __enter__(self) -> None:
        self._post, self._serve = TaskRing.post, HostResidentCopier._serve
        post = self._post

        def landed_at_once(ring: TaskRing, *args, **kwargs):
            event = post(ring, *args, **kwargs)
            ring._done[(event.seq - 1) % ring.slots] = event.seq
            return event

        TaskRing.post = landed_at_once
        HostResidentCopier._serve = lambda copier: None

    def __exit__(self, *exc: object) -> None:
        TaskRing.post, HostResidentCopier._serve = self._post, self._serve


def _sets(rng: np.random.Generator, num_host: int, num_slots: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(rng.choice(num_host, count, replace=False), rng.permutation(num_slots)[:count]) for _ in range(16)]


def host_only() -> None:
    with _StubbedCopy():
        backend = HostBackend()
        host, device = HostPool(backend, 4096, BLOCK), DevicePool(backend, 1024, BLOCK)
        with DmaEngine(host, device) as engine:
            sets = _sets(np.random.default_rng(0), 4096, 1024, 64)

            def submit(i: int):
                return engine.recall(*sets[i % 16], strategy=Strategy.RESIDENT, stream_ordered=False)

            sustained_seconds(submit, 2000, 8)
            runs = [round(sustained_seconds(submit, 20000, 8) * 1e6, 2) for _ in range(3)]
            print(f"host only, 64 x 8 KiB RESIDENT, copy stubbed: {runs} us per transfer", flush=True)


def on_gpu() -> None:
    backend = pulseio.open_backend("cuda")
    host, device = HostPool(backend, 1 << 18, BLOCK), DevicePool(backend, 8192, BLOCK)
    rng = np.random.default_rng(0)
    with DmaEngine(host, device) as engine:
        for count in (64, 512):
            sets = _sets(rng, host.num_blocks, device.num_slots, count)
            for strategy in (Strategy.RESIDENT, Strategy.ZERO_COPY):
                def submit(i: int, strategy: Strategy = strategy):
                    return engine.recall(*sets[i % 16], strategy=strategy, stream_ordered=False)

                for i in range(200):
                    submit(i).wait()
                for window in (1, 4, 8, 16, 32):
                    s = min(sustained_seconds(submit, 3000, window) for _ in range(2))
                    print(f"{count} x 8K {strategy.value} window {window}: {s * 1e6:.1f} us/transfer, "
                          f"{count * BLOCK / s / 1e9:.1f} GB/s", flush=True)
                in_flight, in_submit, in_wait = deque(), 0.0, 0.0
                t0 = time.perf_counter()
                for i in range(3000):
                    if len(in_flight) >= 8:
                        a = time.perf_counter()
                        in_flight.popleft().wait()
                        in_wait += time.perf_counter() - a
                    a = time.perf_counter()
                    in_flight.append(submit(i))
                    in_submit += time.perf_counter() - a
                while in_flight:
                    in_flight.popleft().wait()
                total = time.perf_counter() - t0
                print(f"   split, window 8: total {total / 3000 * 1e6:.1f} us, in submit {in_submit / 3000 * 1e6:.1f}, "
                      f"in wait {in_wait / 3000 * 1e6:.1f}", flush=True)
    host.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", action="store_true", help="also time the CUDA backend")
    args = parser.parse_args()
    host_only()
    if args.gpu:
        on_gpu()


if __name__ == "__main__":
    main()
