"""Does a recall right after the GPU idled run slower than one in a stream of recalls? Per-transfer wall
times for 4096 scattered blocks, back to back and after 100 ms of idle GPU, alone and with a bf16 GEMM on
another stream. The bench's GEMM runs start after such an idle gap (see measure_under_load).

    PYTHONPATH=. python benchmarks/diag_link_idle.py --json PATH      (GPU only; ~20 s)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import pulseio
from pulseio import DevicePool, DmaEngine, HostPool, Strategy
from pulseio.bench.gemm import GemmLoad

COUNT = 4096
RUN = 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    backend = pulseio.open_backend("cuda")
    gemm = GemmLoad()
    rng = np.random.default_rng(0)
    results = []
    for block in (64 << 10, 8 << 10):
        host, device = HostPool(backend, 2 * COUNT, block), DevicePool(backend, COUNT, block)
        engine = DmaEngine(host, device)
        ids = [(rng.choice(2 * COUNT, COUNT, replace=False), rng.permutation(COUNT)) for _ in range(4)]
        for strategy in (Strategy.BATCHED, Strategy.GATHER_DMA, Strategy.ZERO_COPY, Strategy.RESIDENT):
            for i in range(20):
                engine.recall(*ids[i % 4], strategy=strategy, stream_ordered=False).wait()
            for case in ("back_to_back", "after_idle", "after_idle_gemm", "after_idle_warm_gemm"):
                torch.cuda.synchronize()
                if case != "back_to_back":
                    time.sleep(0.1)
                if case == "after_idle_warm_gemm":
                    engine.recall(*ids[0], strategy=strategy, stream_ordered=False).wait()
                if case.endswith("gemm"):
                    gemm.enqueue(32)
                ms = []
                for i in range(RUN):
                    t0 = time.perf_counter()
                    engine.recall(*ids[i % 4], strategy=strategy, stream_ordered=False).wait()
                    ms.append(round((time.perf_counter() - t0) * 1e3, 3))
                torch.cuda.synchronize()
                gbps = [round(COUNT * block / (m * 1e6), 1) for m in ms]
                results.append(dict(block=block, strategy=strategy.value, case=case, ms=ms, gbps=gbps))
                print(f"{block >> 10:>3} KiB {strategy.value:>10} {case:>20}: GB/s {gbps}", flush=True)
        engine.close()
        host.close()
    args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
