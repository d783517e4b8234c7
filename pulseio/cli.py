"""The `pulseio` command: `pulseio bench` measures this machine's block-transfer rates."""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from dataclasses import replace
from pathlib import Path

from .config import DmaConfig
from .plan import Direction, Strategy


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pulseio", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="PCIe peak and scattered block-transfer bandwidth per strategy")
    bench.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default: auto)")
    bench.add_argument("--block-sizes", type=_int_list, default=(8 << 10, 64 << 10), help="bytes, comma-separated")
    bench.add_argument("--counts", type=_int_list, default=(64, 256, 512, 2048, 4096), help="blocks per transfer")
    bench.add_argument(
        "--strategies", default=",".join(s.value for s in Strategy if s is not Strategy.AUTO),
        help="comma-separated subset of " + ", ".join(s.value for s in Strategy if s is not Strategy.AUTO),
    )
    bench.add_argument("--directions", default="h2d,d2h", help="h2d (recall), d2h (offload) or both")
    bench.add_argument("--peak-max-bytes", type=int, default=None, help="largest single copy (default 1 GiB on GPU)")
    bench.add_argument("--host-pool-bytes", type=int, default=None, help="host pool size (default 2 GiB on GPU)")
    bench.add_argument("--window", type=int, default=8, help="transfers in flight while measuring rates")
    bench.add_argument("--zero-copy-ctas", type=int, default=None, help="CTA budget of the copy kernel")
    bench.add_argument("--staging-mib", type=int, default=None, help="size of each pinned staging buffer")
    bench.add_argument("--no-load", action="store_true", help="skip the run under a concurrent GEMM")
    bench.add_argument("--json", type=Path, default=None, help="write every record to this JSON file")
    bench.add_argument("--plot", type=Path, default=None, help="write a bandwidth plot (PNG) here")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument("--verbose", action="store_true", help="print each record as it is measured")
    return parser


def _bench(args: argparse.Namespace) -> int:
    from .bench import BenchOptions, run_bench
    from .bench.report import format_table, write_json, write_plot

    try:
        strategies = tuple(Strategy(s) for s in args.strategies.split(",") if s)
        directions = tuple(Direction(d) for d in args.directions.split(",") if d)
    except ValueError as exc:
        print(f"pulseio bench: {exc}", file=sys.stderr)
        return 2
    dma = DmaConfig()
    if args.zero_copy_ctas:
        dma = replace(dma, zero_copy_ctas=args.zero_copy_ctas)
    if args.staging_mib:
        dma = replace(dma, staging_bytes=args.staging_mib << 20)
    options = BenchOptions(
        device=args.device, block_sizes=args.block_sizes, counts=args.counts, strategies=strategies,
        directions=directions, peak_max_bytes=args.peak_max_bytes, host_pool_bytes=args.host_pool_bytes,
        window=args.window, under_load=not args.no_load, progress=not args.no_progress, verbose=args.verbose, dma=dma,
    )
    # Everything alive now (torch's modules: ~1M objects) is exempt from collection, so a full
    # collection cannot pause one measurement for tens of milliseconds.
    gc.collect()
    gc.freeze()
    meta, records = run_bench(options)
    print(format_table(meta, records))
    if args.json:
        write_json(args.json, meta, records)
        print(f"\nrecords: {args.json}")
    if args.plot:
        write_plot(args.plot, meta, records)
        print(f"plot: {args.plot}")
    return 1 if any(r.verified is False for r in records) else 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    if args.command == "bench":
        return _bench(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
