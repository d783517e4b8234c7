"""Decode's skinny GEMMs (M <= 32 token rows) on one GPU: torch F.linear against Triton `skinny_linear`.

Usage (repo root): python benchmarks/bench_skinny_gemm.py [--json PATH] [--budget-s 85] [--shapes o,down] [--ms 8]
                   python benchmarks/bench_skinny_gemm.py --quick [--json PATH]   (CPU dry run, interpreter, tiny)

Workload: qwen3-14b's projections in bf16, the weight [N, K] as nn.Linear holds it: qkv 7168 x 5120,
o 5120 x 5120, gate_up 34816 x 5120, down 5120 x 17408, lm_head 151936 x 5120; M = 1, 8, 16 and 32 rows.
Each variant is timed as a CUDA graph of 20 back-to-back calls cycling over >= 4 copies of the weight
(>= 200 MB read between two reads of one copy: 4x the 50 MB L2, so weights come from HBM); the median of
7 replays, divided by 20. floor: weight bytes / the rate of an eager 2 GiB device-to-device copy (read +
write bytes over its time, CUDA events, best of 10), i.e. reading the weight once as fast as a copy moves
bytes. Triton variants: the default config (`default_config`, through `config=None`), then tiles
(block_n x block_k, warps, stages; multiply + sum too at M = 1) each at its `default_split_k`, then split_k
1/2/4/8 for the best tile. Each is first checked against F.linear (every element within 2 ulps of bf16 +
1e-3, else BAD: never "best"); one that fails to compile (shared memory) or to run is reported and skipped.
Configs are compiled ahead in --compile-jobs processes (they fill Triton's on-disk cache) to fit the budget.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace

if "--quick" in sys.argv:  # chosen when triton is first imported, so before the imports below
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run without PYTHONPATH too

from pulseio_engine.model.skinny_gemm import (
    SkinnyConfig,
    SkinnyWorkspace,
    _launch_plan,
    _skinny_gemm_kernel,
    _sm_count,
    default_config,
    default_split_k,
    skinny_linear,
)

DTYPE = torch.bfloat16
MAX_SPLIT = 8
SMEM_BUDGET = 160 * 1024  # weight-tile ring per program; an H200 block may use 227 KiB (x tiles, epilogue)


@dataclass(frozen=True)
class Setup:
    device: str
    shapes: dict[str, tuple[int, int]]  # name -> (N, K)
    ms: tuple[int, ...]
    tiles: tuple[tuple[int, int], ...]  # (block_n, block_k) for tl.dot
    sum_tiles: tuple[tuple[int, int], ...]  # (block_n, block_k) for multiply + sum, at M = 1
    warps: tuple[int, ...]
    calls: int  # back-to-back calls per timed graph
    replays: int
    copy_bytes: int
    l2_clear_bytes: float  # bytes of other weight copies read between two reads of one copy

    def stages(self, block_n: int, block_k: int) -> tuple[int, ...]:
        if self.device == "cpu":
            return (2,)
        return tuple(s for s in (3, 4) if s * block_n * block_k * 2 <= SMEM_BUDGET) or (2,)


QWEN3_14B = {"qkv": (7168, 5120), "o": (5120, 5120), "gate_up": (34816, 5120), "down": (5120, 17408),
             "lm_head": (151936, 5120)}
FULL = Setup("cuda", QWEN3_14B, (1, 8, 16, 32),
             tiles=((16, 512), (32, 256), (32, 512), (64, 128), (64, 256), (128, 64), (128, 128), (128, 256)),
             sum_tiles=((16, 512), (32, 256), (64, 128)), warps=(4, 8), calls=20, replays=7, copy_bytes=2 << 30,
             l2_clear_bytes=200e6)
QUICK = Setup("cpu", {"down": (48, 1040)}, (1, 8), tiles=((16, 32), (32, 64)),
              sum_tiles=((16, 32),), warps=(4,), calls=2, replays=2, copy_bytes=64 << 20, l2_clear_bytes=0)


def measure_copy_gbps(setup: Setup) -> float:
    """Device-to-device copy rate, read + written bytes over the copy's time, best of 10 (eager)."""
    src = torch.ones(setup.copy_bytes, dtype=torch.uint8, device=setup.device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = math.inf
    for _ in range(10):
        if setup.device == "cpu":
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * setup.copy_bytes / best / 1e9


def time_us(call: Callable[[int], object], setup: Setup) -> float:
    """Median time of one call: replays of a CUDA graph of `setup.calls` calls (call(i) uses weight i % copies)."""
    if setup.device == "cpu":  # the dry run: eager calls, wall clock
        times = []
        for _ in range(setup.replays):
            t0 = time.perf_counter()
            for i in range(setup.calls):
                call(i)
            times.append((time.perf_counter() - t0) * 1e6 / setup.calls)
        return statistics.median(times)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(0)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(setup.calls):
            call(i)
    graph.replay()
    times = []
    for _ in range(setup.replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / setup.calls)
    return statistics.median(times)


def tile_configs(setup: Setup, m: int, n: int, k: int, sms: int) -> list[SkinnyConfig]:
    tiles = [(bn, bk, True) for bn, bk in setup.tiles] + [(bn, bk, False) for bn, bk in setup.sum_tiles if m == 1]
    return [SkinnyConfig(bn, bk, default_split_k(n, k, bn, bk, sms), warps, stages, use_dot=dot)
            for bn, bk, dot in tiles for warps in setup.warps for stages in setup.stages(bn, bk)]


def split_configs(config: SkinnyConfig, k: int) -> list[SkinnyConfig]:
    """split_k 1, 2, 4, 8 for one tile, keeping >= 2 K tiles per split."""
    k_tiles = -(-k // config.block_k)
    return [replace(config, split_k=s) for s in (1, 2, 4, MAX_SPLIT) if s == 1 or k_tiles >= 2 * s]


def _compile_one(item: tuple[int, int, int, SkinnyConfig]) -> str | None:
    """In a worker process: compile one variant from a plan on meta tensors (no launch, no memory)."""
    n, k, m, config = item
    try:
        x, w = torch.empty((m, k), dtype=DTYPE, device="meta"), torch.empty((n, k), dtype=DTYPE, device="meta")
        ws = SkinnyWorkspace.allocate(n, max_split_k=MAX_SPLIT, device="meta")
        grid, args, meta = _launch_plan(x, w, config, torch.empty((m, n), dtype=DTYPE, device="meta"), ws)
        _skinny_gemm_kernel.warmup(*args, grid=grid, **meta)
        return None
    except Exception as exc:  # reported; the variant fails again, per config, when it is timed
        return f"{config}: {type(exc).__name__}: {str(exc)[:200]}"


def _variant_key(item: tuple[int, int, int, SkinnyConfig]) -> tuple:
    """What Triton specializes a compiled variant on: constexprs, dtypes, and each int's == 1 / % 16."""
    n, k, m, config = item
    x, w = torch.empty((m, k), dtype=DTYPE, device="meta"), torch.empty((n, k), dtype=DTYPE, device="meta")
    ws = SkinnyWorkspace.allocate(n, max_split_k=MAX_SPLIT, device="meta")
    _, args, meta = _launch_plan(x, w, config, None, ws)
    ints = tuple((a == 1, a % 16 == 0) for i, a in enumerate(args) if isinstance(a, int) and i != 5)  # 5: M
    return ints, tuple(sorted(meta.items()))


def precompile(setup: Setup, jobs: int, sms: int, log: Callable[[str], None]) -> dict:
    """Every variant the sweep may time, compiled in `jobs` processes; this process then loads them."""
    items = [(n, k, m, c) for n, k in setup.shapes.values() for m in setup.ms
             for tile in [default_config(m, n, k, sms), *tile_configs(setup, m, n, k, sms)]
             for c in split_configs(tile, k) + [tile]]
    unique = list({_variant_key(item): item for item in items}.values())
    if jobs < 2 or setup.device == "cpu":
        log(f"{len(unique)} variants to compile, each on its first call")
        return {"variants": len(unique), "jobs": 0}
    t0 = time.perf_counter()
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            errors = [e for e in pool.map(_compile_one, unique) if e]
    except Exception as exc:  # a broken pool only costs time: each config compiles on its first call instead
        log(f"precompile failed ({type(exc).__name__}: {exc}); configs compile on first use")
        return {"variants": len(unique), "jobs": jobs, "error": repr(exc)}
    seconds = time.perf_counter() - t0
    log(f"precompiled {len(unique)} variants in {jobs} processes: {seconds:.1f} s, {len(errors)} failed")
    for error in errors[:10]:
        log(f"  {error}")
    return {"variants": len(unique), "jobs": jobs, "seconds": seconds, "failed": errors}


def matches(got: torch.Tensor, expect: torch.Tensor) -> tuple[bool, float]:
    """(every element within 2 ulps of the dtype + 1e-3 of F.linear's, the largest difference)."""
    err = (got.float() - expect.float()).abs()
    ok = bool((err <= 1e-3 + 2 * torch.finfo(got.dtype).eps * expect.float().abs()).all())  # NaN fails
    return ok, err.max().item()


def bench_case(setup: Setup, name: str, m: int, copy_gbps: float, sms: int, deadline: float,
               log: Callable[[str], None]) -> list[dict]:
    n, k = setup.shapes[name]
    gen = torch.Generator(device=setup.device).manual_seed(0)
    weight_bytes = n * k * 2
    copies = max(4, math.ceil(setup.l2_clear_bytes / weight_bytes))
    weights = [torch.randn((n, k), generator=gen, device=setup.device, dtype=DTYPE).mul_(k**-0.5)
               for _ in range(copies)]  # weight: [N, K]
    x = torch.randn((m, k), generator=gen, device=setup.device, dtype=DTYPE)  # x: [M, K]
    expect = F.linear(x, weights[0])
    out = torch.empty((m, n), dtype=DTYPE, device=setup.device)
    ws = SkinnyWorkspace.allocate(n, max_split_k=MAX_SPLIT, device=setup.device)
    floor_us = weight_bytes / copy_gbps / 1e3
    rows: list[dict] = []

    def record(tag: str, config: SkinnyConfig | None, call: Callable[[int], torch.Tensor]) -> dict | None:
        row: dict = dict(shape=name, m=m, n=n, k=k, tag=tag, config=asdict(config) if config else None,
                         floor_us=floor_us)
        rows.append(row)
        if time.monotonic() > deadline:
            row["error"] = "skipped: over the time budget"
            return None
        try:
            t0 = time.perf_counter()
            got = call(0)
            if setup.device == "cuda":
                torch.cuda.synchronize()
            row["first_call_s"] = time.perf_counter() - t0  # compiles (or loads) a new variant
            row["ok"], row["max_err"] = matches(got, expect)
            row["us"] = time_us(call, setup)
        except Exception as exc:  # a config that fails to compile or run is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            ws.counters.zero_()
            log(f"  {tag:7s} {_config_str(config)}  FAILED {row['error']}")
            return None
        log(f"  {tag:7s} {_config_str(config):28s} {row['us']:9.1f} us  {row['us'] / floor_us:5.2f}x floor"
            f"  err={row['max_err']:.1e}{'' if row['ok'] else '  BAD'}")
        return row

    log(f"== {name} N={n} K={k} M={m}: weight {weight_bytes / 1e6:.1f} MB x {copies} copies, "
        f"floor {floor_us:.1f} us")
    record("torch", None, lambda i: F.linear(x, weights[i % copies]))
    default = default_config(m, n, k, sms)
    record("default", default, lambda i: skinny_linear(x, weights[i % copies], out=out, workspace=ws))

    def triton_call(config: SkinnyConfig) -> Callable[[int], torch.Tensor]:
        return lambda i: skinny_linear(x, weights[i % copies], config=config, out=out, workspace=ws)

    for config in tile_configs(setup, m, n, k, sms):
        if config != default:
            record("tile", config, triton_call(config))
    best = _best(rows)
    if best is not None:
        tried = {SkinnyConfig(**r["config"]) for r in rows if r["config"]}
        for config in split_configs(SkinnyConfig(**best["config"]), k):
            if config not in tried:
                record("split", config, triton_call(config))
    return rows


def _best(rows: list[dict]) -> dict | None:
    ok = [r for r in rows if r["tag"] != "torch" and r.get("ok")]
    return min(ok, key=lambda r: r["us"]) if ok else None


def _config_str(config: SkinnyConfig | dict | None) -> str:
    if config is None:
        return "F.linear"
    c = config if isinstance(config, dict) else asdict(config)
    return (f"{c['block_n']}x{c['block_k']} sk{c['split_k']} w{c['num_warps']} st{c['num_stages']}"
            f"{'' if c['use_dot'] else ' sum'}")


def summarize(rows: list[dict], setup: Setup) -> tuple[list[dict], str]:
    table, lines = [], [
        "", "SUMMARY (us per call from CUDA-graph replays; (x) = time / weight-read floor; speedup = torch / best)",
        f"{'shape':8s} {'M':>3s} {'floor':>7s} | {'torch':>7s} {'(x)':>5s} | {'default':>7s} {'(x)':>5s} | "
        f"{'best':>7s} {'(x)':>5s} {'speedup':>7s} {'best config':28s} | bad failed",
    ]
    for name in setup.shapes:
        for m in setup.ms:
            mine = [r for r in rows if r["shape"] == name and r["m"] == m]
            if not mine:
                continue
            torch_row = next((r for r in mine if r["tag"] == "torch" and "us" in r), None)
            default = next((r for r in mine if r["tag"] == "default" and r.get("ok")), None)
            best = _best(mine)
            us = lambda r: r["us"] if r else math.nan  # noqa: E731
            floor = mine[0]["floor_us"]
            entry = dict(shape=name, m=m, floor_us=floor, torch_us=us(torch_row), default_us=us(default),
                         best_us=us(best), best_config=best["config"] if best else None,
                         bad=sum(r.get("ok") is False for r in mine), failed=sum("error" in r for r in mine))
            table.append(entry)
            lines.append(
                f"{name:8s} {m:3d} {floor:7.1f} | {entry['torch_us']:7.1f} {entry['torch_us'] / floor:5.2f} | "
                f"{entry['default_us']:7.1f} {entry['default_us'] / floor:5.2f} | {entry['best_us']:7.1f} "
                f"{entry['best_us'] / floor:5.2f} {entry['torch_us'] / entry['best_us']:7.2f} "
                f"{_config_str(entry['best_config']) if best else '-':28s} | {entry['bad']:3d} {entry['failed']:6d}")
    lines.append("config = block_n x block_k, split_k, warps, stages (sum: multiply + sum instead of tl.dot)")
    return table, "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write every row and the summary here")
    parser.add_argument("--budget-s", type=float, default=85.0, help="start no variant after this many seconds")
    parser.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    parser.add_argument("--ms", default="", help="comma-separated row counts (default: 1,8,16,32)")
    parser.add_argument("--compile-jobs", type=int, default=min(16, os.cpu_count() or 1),
                        help="processes compiling variants ahead (0: compile each on first use)")
    parser.add_argument("--quick", action="store_true", help="CPU dry run under TRITON_INTERPRET=1, tiny shapes")
    args = parser.parse_args()
    setup = QUICK if args.quick else FULL
    if setup.device == "cuda" and not torch.cuda.is_available():
        print("bench_skinny_gemm: no CUDA device (--quick runs the dry run on CPU)", file=sys.stderr)
        return 2
    wanted = [s for s in args.shapes.split(",") if s]
    unknown = sorted(set(wanted) - set(setup.shapes))
    if unknown:
        print(f"bench_skinny_gemm: unknown shapes {unknown}; known: {sorted(setup.shapes)}", file=sys.stderr)
        return 2
    setup = replace(setup, shapes={s: v for s, v in setup.shapes.items() if not wanted or s in wanted},
                    ms=tuple(int(m) for m in args.ms.split(",")) if args.ms else setup.ms)
    deadline = time.monotonic() + args.budget_s
    log = lambda line: print(line, flush=True)  # noqa: E731
    import triton

    device = "cpu (TRITON_INTERPRET=1: the timings mean nothing)"
    if setup.device == "cuda":
        device = torch.cuda.get_device_name()
    sms = _sm_count(torch.device(setup.device))
    log(f"device {device}, {sms} SMs, torch {torch.__version__}, triton {triton.__version__}")
    copy_gbps = measure_copy_gbps(setup)
    log(f"D2D copy {setup.copy_bytes >> 20} MiB: {copy_gbps:.0f} GB/s (read + write bytes)")
    compiled = precompile(setup, args.compile_jobs, sms, log)
    rows: list[dict] = []
    for name in setup.shapes:
        for m in setup.ms:
            rows += bench_case(setup, name, m, copy_gbps, sms, deadline, log)
            if setup.device == "cuda":
                torch.cuda.empty_cache()
    table, text = summarize(rows, setup)
    log(text)
    skipped = sum(r.get("error", "").startswith("skipped") for r in rows)
    if skipped:
        log(f"{skipped} variants skipped: over the {args.budget_s:.0f} s budget (--budget-s, --shapes, --ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device, sms=sms, torch=torch.__version__, triton=triton.__version__,
                           copy_gbps=copy_gbps, calls_per_graph=setup.calls, replays=setup.replays,
                           precompile=compiled, summary=table, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
