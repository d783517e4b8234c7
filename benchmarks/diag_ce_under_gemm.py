"""Why does a batched recall run at ~0.82 of the link while a GEMM runs, and 0.92 alone? Copy-engine
throughput and GEMM time, both from CUDA events (no host timing), for a contiguous copy and for
`cuMemcpyBatchAsync` of 4096 scattered 64 KiB blocks on one, two and four streams, and with the
PREFER_OVERLAP_WITH_COMPUTE flag; each alone and with a bf16 GEMM on another stream.

    PYTHONPATH=. python benchmarks/diag_ce_under_gemm.py --json PATH      (GPU only; ~20 s)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import pulseio
from pulseio import DevicePool, HostPool
from pulseio._cuda import driver
from pulseio.bench.gemm import GemmLoad

BLOCK, COUNT, TRANSFERS, REPEATS = 64 << 10, 4096, 8, 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    backend = pulseio.open_backend("cuda")
    host, pool = HostPool(backend, 2 * COUNT, BLOCK), DevicePool(backend, COUNT, BLOCK)
    rng = np.random.default_rng(0)
    sets = []
    for _ in range(4):
        h, s = rng.choice(2 * COUNT, COUNT, replace=False), rng.permutation(COUNT)
        sets.append(((pool.device_ptr + s * BLOCK).astype(np.uint64), (host.device_ptr + h * BLOCK).astype(np.uint64),
                     np.full(COUNT, BLOCK, dtype=np.uint64)))
    gemm = GemmLoad()
    streams = [torch.cuda.Stream(priority=-1) for _ in range(4)]
    batch = driver.MemcpyBatch(host_to_device=True, device_ordinal=0)
    overlap = driver.MemcpyBatch(host_to_device=True, device_ordinal=0)
    overlap._attrs.flags = 1  # CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
    src, dst = host.blocks[:COUNT], pool.slots

    def contiguous(i: int, s: torch.cuda.Stream) -> None:
        with torch.cuda.stream(s):
            dst.copy_(src, non_blocking=True)

    def batched(fn):
        return lambda i, s: fn(*sets[i % 4], s.cuda_stream)

    variants = {"contiguous_1s": (contiguous, 1), "batched_1s": (batched(batch), 1),
                "batched_2s": (batched(batch), 2), "batched_4s": (batched(batch), 4),
                "batched_overlap_flag": (batched(overlap), 1)}

    def measure(copy, nstreams: int, loaded: bool) -> tuple[float | None, float | None]:
        torch.cuda.synchronize()
        time.sleep(0.1)
        g0, g1 = gemm.enqueue(32) if loaded else (None, None)
        marks = []
        for i in range(TRANSFERS if copy else 0):
            s = streams[i % nstreams]
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(s)
            copy(i, s)
            e1.record(s)
            marks.append((e0, e1))
        torch.cuda.synchronize()
        gbps = None
        if marks:
            span_ms = max(marks[0][0].elapsed_time(e1) for _, e1 in marks)
            gbps = TRANSFERS * COUNT * BLOCK / span_ms / 1e6
        return gbps, (g0.elapsed_time(g1) / 32 if loaded else None)

    measure(None, 1, True)
    results = []
    for name, (copy, nstreams) in variants.items():
        measure(copy, nstreams, False)
        alone_gbps, loaded_gbps, alone_ms, loaded_ms = [], [], [], []
        for _ in range(REPEATS):
            alone_gbps.append(measure(copy, nstreams, False)[0])
            alone_ms.append(measure(None, 1, True)[1])
            g, ms = measure(copy, nstreams, True)
            loaded_gbps.append(g)
            loaded_ms.append(ms)
        row = dict(variant=name, alone_gbps=alone_gbps, loaded_gbps=loaded_gbps, gemm_ms_alone=alone_ms,
                   gemm_ms_loaded=loaded_ms,
                   slowdown=statistics.median(loaded_ms) / statistics.median(alone_ms) - 1)
        results.append(row)
        print(f"{name:>22}: alone {statistics.median(alone_gbps):5.1f} GB/s, with GEMM "
              f"{statistics.median(loaded_gbps):5.1f} GB/s, GEMM {statistics.median(alone_ms):.3f} -> "
              f"{statistics.median(loaded_ms):.3f} ms ({row['slowdown']:+.1%})", flush=True)
    args.json.write_text(json.dumps(results, indent=1))
    host.close()


if __name__ == "__main__":
    main()
