"""The `pulseio` command: `pulseio bench` measures this machine's block-transfer rates.

With a GPU it measures PCIe (pinned host memory <-> GPU); without one, host memory copies through
the CPU backend. On a CPU the default is a quick run (under a minute on 2 cores); --full runs the
whole sweep. Every option is checked before any work; a mistake is one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from .cliargs import (
    DEBUG_HELP,
    OneLineParser,
    UsageError,
    check_writable,
    choice_list,
    device_name,
    int_at_least,
    int_list,
    progress_enabled,
    require_device,
    run_command,
)
from .config import DmaConfig
from .gc_pauses import frozen_heap
from .machine import MEMORY_LIMIT_ENV
from .plan import Direction, Strategy

PROG = "pulseio"
_STRATEGIES = tuple(s.value for s in Strategy if s is not Strategy.AUTO)
_FULL = {"block_sizes": (8 << 10, 64 << 10), "counts": (64, 256, 512, 2048, 4096)}
_QUICK_CPU = {"block_sizes": (8 << 10,), "counts": (64, 2048), "volume": 0.125}


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{bench}")
    bench = sub.add_parser(
        "bench", help="PCIe (or, without a GPU, host memory) peak and scattered block-transfer bandwidth",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"{MEMORY_LIMIT_ENV}=8G (say) lowers the memory the run may use. Results default to results/.",
    )
    a = bench.add_argument
    a("--device", type=device_name(allow_auto=True), default="auto",
      help="auto | cpu | cuda | cuda:N (default: auto = cuda when torch sees a GPU)")
    a("--full", action="store_true", help="the whole sweep on a CPU too (about 6 minutes on 2 cores)")
    a("--block-sizes", type=int_list(16, multiple_of=16), default=None,
      help="bytes per block, comma-separated (default: 8192,65536; quick CPU run: 8192)")
    a("--counts", type=int_list(1), default=None,
      help="blocks per transfer, comma-separated (default: 64,256,512,2048,4096; quick CPU run: 64,4096)")
    a("--strategies", type=choice_list(_STRATEGIES), default=_STRATEGIES,
      help=f"comma-separated subset of {','.join(_STRATEGIES)} (default: all)")
    a("--directions", type=choice_list(tuple(d.value for d in Direction)), default=("h2d", "d2h"),
      help="h2d (recall), d2h (offload) or both (default: h2d,d2h)")
    a("--peak-max-bytes", type=int_at_least(4096), default=None,
      help="largest single copy of the peak sweep (default: 1 GiB on GPU, 256 MiB on CPU)")
    a("--host-pool-bytes", type=int_at_least(16), default=None,
      help="host pool size; must hold the largest count (default: 2 GiB on GPU, 256 MiB on CPU, or 2 x the "
           "largest count of blocks if more)")
    a("--window", type=int_at_least(1), default=8, help="transfers in flight while measuring rates (default: 8)")
    a("--zero-copy-ctas", type=int_at_least(1), default=None, help="CTA budget of the copy kernel (default: DmaConfig)")
    a("--staging-mib", type=int_at_least(1), default=None, help="MiB per pinned staging buffer (default: DmaConfig)")
    a("--no-load", action="store_true", help="skip the run under a concurrent GEMM (GPU only)")
    a("--json", type=Path, default=Path("results/bench.json"), help="write every record here (default: %(default)s)")
    a("--plot", type=Path, default=Path("results/bench.png"),
      help="write a bandwidth plot here, needs matplotlib (default: %(default)s)")
    a("--no-save", action="store_true", help="write neither the JSON nor the plot")
    a("--no-progress", dest="progress", action="store_false", help="no progress bar (shown only on a terminal)")
    a("--verbose", action="store_true", help="print each record as it is measured")
    a("--debug", action="store_true", help=DEBUG_HELP)
    bench.set_defaults(prog=bench.prog)
    return parser


def _options(args: argparse.Namespace, device: str):  # noqa: ANN202 (BenchOptions, imported lazily)
    from .bench import BenchOptions

    sweep: dict[str, Any] = dict(_FULL if args.full or device != "cpu" else _QUICK_CPU)
    given = ("block_sizes", "counts", "peak_max_bytes", "host_pool_bytes")
    sweep.update({k: v for k in given if (v := getattr(args, k)) is not None})
    dma = DmaConfig()
    if args.zero_copy_ctas:
        dma = replace(dma, zero_copy_ctas=args.zero_copy_ctas)
    if args.staging_mib:
        dma = replace(dma, staging_bytes=args.staging_mib << 20)
    try:
        return BenchOptions(
            device=device, strategies=tuple(Strategy(s) for s in args.strategies),
            directions=tuple(Direction(d) for d in args.directions), window=args.window,
            under_load=not args.no_load, progress=progress_enabled(args.progress), verbose=args.verbose, dma=dma,
            **sweep,
        )
    except ValueError as exc:
        raise UsageError(args.prog, str(exc)) from None


def _bench(args: argparse.Namespace) -> int:
    # warnings only: INFO lines of the libraries below (numba's "add pending dealloc") would follow the table
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    device = require_device(args.prog, args.device)
    plot = None if args.no_save else args.plot
    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(args.prog, f"--plot {plot} needs matplotlib, which is not installed; "
                                    "pip install 'pulseio[plot]', or pass --no-save")
    if not args.no_save:
        check_writable(args.prog, "--json", args.json)
        check_writable(args.prog, "--plot", args.plot)
    options = _options(args, device)
    from .bench import run_bench
    from .bench.report import format_table, write_json, write_plot
    from .bench.suite import check_bench_memory

    check_bench_memory(options, device != "cpu", device)   # before the backend pins anything
    with frozen_heap():       # torch's ~1M objects: no full collection pauses a measurement walking them
        meta, records = run_bench(options)
    print(format_table(meta, records))
    if not args.no_save:
        write_json(args.json, meta, records)
        write_plot(plot, meta, records)  # type: ignore[arg-type]  # set whenever saving
        print(f"\nrecords: {args.json}\nplot: {plot}")
    return 1 if any(r.verified is False for r in records) else 0


def main(argv: list[str] | None = None) -> int:
    return run_command(PROG, _parser(), argv, _bench)


if __name__ == "__main__":
    sys.exit(main())
