"""Why does a recall slow a concurrent GEMM? GEMM time and the GPU's clocks, power and throttle reasons
(nvidia-smi, sampled every 20 ms) through phases: GEMM alone, GEMM + batched 64 KiB recall, GEMM alone,
GEMM + the host only polling (the bench's control), GEMM + per-block recall, GEMM alone.

    PYTHONPATH=. python benchmarks/diag_gemm_clock.py --out DIR      (GPU only; ~30 s)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np

import pulseio
from pulseio import DevicePool, DmaEngine, HostPool, Strategy
from pulseio.bench.gemm import GemmLoad

PHASE_S = 1.5
BLOCK = 64 << 10
COUNT = 4096


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    backend = pulseio.open_backend("cuda")
    host, device = HostPool(backend, 2 * COUNT, BLOCK), DevicePool(backend, COUNT, BLOCK)
    engine = DmaEngine(host, device)
    rng = np.random.default_rng(0)
    ids = [(rng.choice(2 * COUNT, COUNT, replace=False), rng.permutation(COUNT)) for _ in range(4)]
    gemm = GemmLoad()
    gemm.enqueue(1)[1].synchronize()  # cuBLAS's setup, outside the phases (run -r's first phase paid for it)
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,"
         "clocks_event_reasons.active", "--format=csv,noheader", "-lms", "20"],
        stdout=open(out / "smi.csv", "w"), stderr=subprocess.STDOUT)
    time.sleep(1.0)

    def phase(name: str, strategy: Strategy | None, poll: bool) -> dict:
        times, moved, t_start = [], 0, time.time()
        deadline = time.perf_counter() + PHASE_S
        i = 0
        while time.perf_counter() < deadline:
            start, end = gemm.enqueue(8)
            flight = []
            while not end.query():
                if strategy is not None:
                    if len(flight) >= 4:
                        flight.pop(0).wait()
                    h, s = ids[i % 4]
                    flight.append(engine.recall(h, s, strategy=strategy, stream_ordered=False))
                    moved += COUNT * BLOCK
                    i += 1
                elif not poll:
                    end.synchronize()
            for t in flight:
                t.wait()
            times.append(start.elapsed_time(end) / 8)
        return {"phase": name, "start_unix": t_start, "end_unix": time.time(), "gemm_ms_median": float(np.median(times)),
                "gemm_ms": [round(t, 3) for t in times], "gbps": moved / PHASE_S / 1e9}

    phases = [phase("alone", None, False), phase("batched_64k", Strategy.BATCHED, True), phase("alone", None, False),
              phase("host_polls", None, True), phase("per_block_64k", Strategy.PER_BLOCK, True),
              phase("alone", None, False)]
    time.sleep(0.5)
    smi.terminate()
    engine.close()
    host.close()
    (out / "phases.json").write_text(json.dumps(phases, indent=1))
    for p in phases:
        print(f"{p['phase']:>14}: GEMM {p['gemm_ms_median']:.3f} ms (runs {min(p['gemm_ms']):.3f}..{max(p['gemm_ms']):.3f}), "
              f"recall {p['gbps']:.1f} GB/s")


if __name__ == "__main__":
    main()
