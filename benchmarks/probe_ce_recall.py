"""One layer's recall on the copy engine against the resident copier: n scattered 64 KiB units, H2D.

    PYTHONPATH=. python benchmarks/probe_ce_recall.py --json out.json [--counts 104,208,832] [--reps 30]

Per count, with fresh random ids each repetition (data checked bit for bit on the last one):
* ce_gated: `cuMemcpyBatchAsync` enqueued behind a GPU sleep, events around it: the copy engine's own time;
* ce_submit: the stream idle, an event, the call, an event: the driver call's latency plus the copy, i.e.
  what a host thread that has just read the ids adds before the data lands (and the call's host time);
* resident: `DmaEngine.recall(strategy=RESIDENT)` on a warm copier: its own stamps, start -> landed;
and each of those again while another stream keeps HBM busy (device-to-device copies of 1 GiB), as
the decode's kernels do. Rates are fractions of a 512 MiB contiguous H2D copy measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pulseio  # noqa: E402
from pulseio import DmaConfig, Strategy  # noqa: E402
from pulseio._cuda import driver  # noqa: E402
from pulseio.bench.records import git_sha  # noqa: E402

UNIT = 64 << 10


def link_peak(nbytes: int = 512 << 20, reps: int = 5) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = float("inf")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3)
    return nbytes / best / 1e9


class Load:
    """Device-to-device copies of 1 GiB on their own stream: HBM kept busy while the recall runs."""

    def __init__(self) -> None:
        self.stream = torch.cuda.Stream()
        self.a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        self.b = torch.empty_like(self.a)

    def start(self, copies: int = 60) -> None:
        with torch.cuda.stream(self.stream):
            for _ in range(copies):
                self.b.copy_(self.a)

    def stop(self) -> None:
        self.stream.synchronize()


def ce_once(batch: driver.MemcpyBatch, host: pulseio.HostPool, dev: pulseio.DevicePool, ids: np.ndarray,
            slots: np.ndarray, stream: torch.cuda.Stream, gated: bool) -> tuple[float, float]:
    """(GPU seconds between the events, host seconds in the call)."""
    srcs = (host.device_ptr + ids.astype(np.uint64) * UNIT).astype(np.uint64)
    dsts = (dev.device_ptr + slots.astype(np.uint64) * UNIT).astype(np.uint64)
    sizes = np.full(len(ids), UNIT, dtype=np.uint64)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        if gated:
            torch.cuda._sleep(200_000)   # the call below is enqueued well before the copy can start
        a.record()
        t0 = time.perf_counter()
        batch(dsts, srcs, sizes, stream.cuda_stream)
        t1 = time.perf_counter()
        b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3, t1 - t0


def resident_once(dma: pulseio.DmaEngine, ids: np.ndarray, slots: np.ndarray) -> float:
    t = dma.recall(host_ids=ids, device_slots=slots, strategy=Strategy.RESIDENT, stream_ordered=False)
    t.wait()
    event = t.device_event
    return (event.landed_ns() - event.taken_ns()) / 1e9


def summary(seconds: list[float], nbytes: int, peak: float) -> dict:
    s = np.asarray(seconds)
    p50 = float(np.median(s))
    return {"n": len(s), "p50_us": p50 * 1e6, "p10_us": float(np.percentile(s, 10)) * 1e6,
            "p90_us": float(np.percentile(s, 90)) * 1e6, "gbps_p50": nbytes / p50 / 1e9,
            "of_peak_p50": nbytes / p50 / 1e9 / peak}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--counts", default="104,208,832")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--host-units", type=int, default=32768)
    args = p.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    torch.cuda.init()
    backend = pulseio.open_backend("cuda")
    host = pulseio.HostPool(backend, num_blocks=args.host_units, block_bytes=UNIT)
    dev = pulseio.DevicePool(backend, num_slots=max(counts) + 1, block_bytes=UNIT)
    host.view(torch.int64, UNIT // 8).copy_(torch.randint(-2**62, 2**62, (args.host_units, UNIT // 8)))
    batch = driver.MemcpyBatch(host_to_device=True, device_ordinal=torch.cuda.current_device())
    stream = torch.cuda.Stream()
    rng = np.random.default_rng(0)
    peak = link_peak()
    out: dict = {"git_sha": git_sha(), "device": torch.cuda.get_device_name(), "date": time.strftime("%F %T"),
                 "peak_gbps": peak, "unit_bytes": UNIT, "host_units": args.host_units, "rows": []}
    load = Load()
    dma = pulseio.DmaEngine(host, dev, config=DmaConfig(resident_idle_us=100_000))
    with dma:
        for loaded in (False, True):
            for n in counts:
                nbytes = n * UNIT
                times: dict[str, list[float]] = {"ce_gated": [], "ce_submit": [], "ce_call_host": [], "resident": []}
                resident_once(dma, np.arange(n), np.arange(n))   # the copier up before any load
                if loaded:
                    load.start()
                    time.sleep(0.002)
                for _ in range(args.reps):
                    ids = rng.choice(args.host_units, size=n, replace=False).astype(np.int64)
                    slots = rng.permutation(n).astype(np.int64)
                    if not loaded:   # the gate's sleep kernel would queue behind the load's copies
                        times["ce_gated"].append(ce_once(batch, host, dev, ids, slots, stream, gated=True)[0])
                    gpu, call = ce_once(batch, host, dev, ids, slots, stream, gated=False)
                    times["ce_submit"].append(gpu)
                    times["ce_call_host"].append(call)
                    times["resident"].append(resident_once(dma, ids, slots))
                if loaded:
                    load.stop()
                want = host.view(torch.uint8, UNIT)[torch.from_numpy(ids)]
                got = dev.view(torch.uint8, UNIT)[torch.from_numpy(slots)].cpu()
                row = {"loaded": loaded, "units": n, "bytes": nbytes, "bit_exact_last": bool(torch.equal(want, got)),
                       **{k: summary(v, nbytes, peak) for k, v in times.items() if v and k != "ce_call_host"},
                       "ce_call_host_us_p50": float(np.median(times["ce_call_host"])) * 1e6}
                out["rows"].append(row)
                print(f"{'loaded' if loaded else 'idle  '} {n:4d} x 64K: " + "  ".join(
                    f"{k} {row[k]['p50_us']:.1f} us ({row[k]['of_peak_p50']:.3f})"
                    for k in ("ce_gated", "ce_submit", "resident") if k in row)
                    + f"  call {row['ce_call_host_us_p50']:.1f} us  exact {row['bit_exact_last']}", flush=True)
    print(f"peak {peak:.1f} GB/s")
    args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
