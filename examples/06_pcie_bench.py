"""Benchmark your own machine's link from Python: how fast each pulseio strategy moves scattered blocks from
pinned host memory to the GPU, against one large copy (what `pulseio bench` runs, here a quick sweep).

    python examples/06_pcie_bench.py [--device cpu|cuda] [--block-bytes 65536] [--counts 64,512]

Without a GPU it measures host memory copies through the CPU backend (the table says so), not PCIe. Every
recall is checked bit for bit; `pulseio bench --json out.json` runs the full sweep with a plot.
"""

from __future__ import annotations

import argparse

import pulseio
from pulseio.bench import BenchOptions, run_bench
from pulseio.bench.report import format_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--block-bytes", type=int, default=64 << 10)
    parser.add_argument("--counts", default="64,512", help="blocks per transfer, comma-separated")
    parser.add_argument("--peak-max-bytes", type=int, default=256 << 20, help="largest single copy for the peak")
    args = parser.parse_args()
    counts = tuple(int(c) for c in args.counts.split(","))
    options = BenchOptions(device=args.device, block_sizes=(args.block_bytes,), counts=counts,
                           directions=(pulseio.Direction.H2D,), under_load=False, progress=False, volume=0.125,
                           peak_max_bytes=args.peak_max_bytes)
    meta, records = run_bench(options)
    print(format_table(meta, records))
    peak = meta["peak_gbps"]["h2d"]
    for count in counts:
        rows = [r for r in records if r.num_blocks == count and r.kind == "recall" and r.strategy != "auto"]
        best = max(rows, key=lambda r: r.gbps)
        assert all(r.verified for r in rows), f"a recall of {count} blocks moved wrong bytes"
        print(f"{count} x {args.block_bytes >> 10} KiB: best {best.strategy} at {best.gbps:.1f} GB/s, "
              f"{best.gbps / peak:.2f} of one large copy ({peak:.1f} GB/s), every recall bit-exact")


if __name__ == "__main__":
    main()
