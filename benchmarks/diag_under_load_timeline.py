"""Where does the bench's loaded run lose time? The loop of `measure_under_load` (4096 x 64 KiB BATCHED
recalls back to back, window 8, while 32 bf16 GEMMs run) with host timestamps of every submit and wait.

    PYTHONPATH=. python benchmarks/diag_under_load_timeline.py --json PATH      (GPU only; ~10 s)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import pulseio
from pulseio import DevicePool, DmaEngine, HostPool, Strategy
from pulseio.bench.gemm import GemmLoad
from pulseio.bench.measure import IdSets

BLOCK, COUNT, WINDOW = 64 << 10, 4096, 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    backend = pulseio.open_backend("cuda")
    host, pool = HostPool(backend, 2 * COUNT, BLOCK), DevicePool(backend, COUNT, BLOCK)
    engine = DmaEngine(host, pool)
    ids = IdSets(2 * COUNT, COUNT, COUNT, 4, seed=0)
    gemm = GemmLoad()
    runs = []
    for run in range(4):
        torch.cuda.synchronize()
        time.sleep(0.1)
        g0, g1 = gemm.enqueue(32)
        t0 = time.perf_counter()
        events, in_flight, i, gemm_done_at = [], [], 0, None
        while True:
            if gemm_done_at is None and g1.query():
                gemm_done_at = time.perf_counter() - t0
                break
            if len(in_flight) >= WINDOW:
                w0 = time.perf_counter() - t0
                k, t = in_flight.pop(0)
                t.wait()
                events.append(("wait", k, w0, time.perf_counter() - t0))
            s0 = time.perf_counter() - t0
            t = engine.recall(ids.host[i % 4], ids.slots[i % 4], strategy=Strategy.BATCHED, stream_ordered=False)
            events.append(("submit", i, s0, time.perf_counter() - t0))
            in_flight.append((i, t))
            i += 1
        for k, t in in_flight:
            w0 = time.perf_counter() - t0
            t.wait()
            events.append(("wait", k, w0, time.perf_counter() - t0))
        end = time.perf_counter() - t0
        rate = i * COUNT * BLOCK / end / 1e9
        runs.append(dict(gemm_ms=g0.elapsed_time(g1), gemm_done_at=gemm_done_at, end=end, transfers=i, gbps=rate,
                         events=[(kind, k, round(x * 1e3, 3), round(y * 1e3, 3)) for kind, k, x, y in events]))
        print(f"run {run}: GEMM {g0.elapsed_time(g1):.1f} ms, seen done at {gemm_done_at * 1e3:.1f} ms, "
              f"{i} transfers, drained at {end * 1e3:.1f} ms -> {rate:.1f} GB/s", flush=True)
        for kind, k, x, y in events:
            print(f"   {kind:>6} {k:>3}: {x * 1e3:8.3f} -> {y * 1e3:8.3f} ms")
    args.json.write_text(json.dumps(runs, indent=1))
    engine.close()
    host.close()


if __name__ == "__main__":
    main()
