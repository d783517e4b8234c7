"""Paged decode attention on one GPU: achieved KV bandwidth per launch configuration.

Usage (repo root): PYTHONPATH=. python benchmarks/bench_attention.py [--budget-s 80] [--out DIR] [--shapes sparse]
    [--cold 3]

Workload: bf16 q and KV with random values (speed does not depend on them), pages of 16 tokens placed
at shuffled physical ids in an engine-shaped `kv: [num_blocks, 2, 16, Hkv, D]` tensor, every sequence of
a batch at the stated context length unless the shape says "ragged". Each configuration is timed as
CUDA-graph replays of 10 back-to-back calls (what the engine's captured decode step sees), median of 15
replays; with `--cold N` the calls take N input sets in turn, so each reads KV that the L2 (50 MB) does not
hold from the call before, as a decode step's attention does. GB/s counts the K and V bytes of every context
token once; "%copy" divides that by the bandwidth of a 1 GiB device-to-device copy measured in the same process
(read + write bytes, eager as the engine bench measures it).
"err" is the worst per-(sequence, head) relative error against the fp32 reference; a config with
err > 1e-2 is marked BAD and never chosen as best.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run without PYTHONPATH too

from pulseio_engine.attention import paged_decode_attention, paged_decode_attention_reference
from pulseio_engine.attention._launch import (
    DecodeConfig,
    _num_sms,
    choose_config,
    paged_decode_attention_triton,
)
from pulseio_engine.bench import measure_copy_bandwidth_sync


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    hq: int
    hkv: int
    head_dim: int
    context: int  # tokens per sequence (ragged: the maximum)
    max_blocks: int  # block-table width; > context / 16 models a table sized for a longer max length
    sweep: str  # "full": tiles then splits; "splits": splits only; "none": the heuristic only
    ragged: bool = False
    row_pages: int = 0  # > 0: per-head tables (Quest's), each head `context / 16` of a sequence's `row_pages` pages
    head_major: bool = False  # pages laid out [2, Hkv, 16, D] (a head's page contiguous) instead of [2, 16, Hkv, D]


SHAPES = [
    Shape("qwen3-14b b64x4k", 64, 40, 8, 128, 4096, 256, "full"),
    Shape("qwen3-14b b16x32k", 16, 40, 8, 128, 32768, 2048, "full"),
    Shape("smollm2 b64x4k", 64, 9, 3, 64, 4096, 256, "full"),
    Shape("qwen3-14b b64x4k table32k", 64, 40, 8, 128, 4096, 2048, "splits"),
    Shape("qwen3-14b b64 ragged<=8k", 64, 40, 8, 128, 8192, 512, "splits", ragged=True),
    Shape("llama3-8b b32x8k", 32, 32, 8, 128, 8192, 512, "none"),
    # a sparse layer's attention over its budget (2048 tokens: 128 selected pages) at the batches the sparse
    # step is benched at (8 and 16 requests at 32K, 32 at 8K)
    Shape("qwen3-14b sparse b8 k128", 8, 40, 8, 128, 2048, 128, "full"),
    Shape("qwen3-14b sparse b16 k128", 16, 40, 8, 128, 2048, 128, "full"),
    Shape("qwen3-14b sparse b32 k128", 32, 40, 8, 128, 2048, 128, "full"),
    # Quest's per-head selection at 8 x 32K: each KV head its own 128 of the request's 2048 pages, read through
    # its own table, in the engine's token-major pages and in head-major ones (a head's page one 4 KiB run)
    Shape("qwen3-14b quest b8 k128 rows", 8, 40, 8, 128, 2048, 128, "full", row_pages=2048),
    Shape("qwen3-14b quest b8 k128 rows head-major", 8, 40, 8, 128, 2048, 128, "splits", row_pages=2048,
          head_major=True),
    Shape("qwen3-14b sparse b8 k128 head-major", 8, 40, 8, 128, 2048, 128, "splits", head_major=True),
    # and the dense step's attention, which the sparse step is compared with, in both layouts
    Shape("qwen3-14b dense b8x32k", 8, 40, 8, 128, 32768, 2048, "none"),
    Shape("qwen3-14b dense b8x32k head-major", 8, 40, 8, 128, 32768, 2048, "none", head_major=True),
]
PAGE = 16
DEVICE = "cuda"  # a dry run of the bookkeeping on CPU (TRITON_INTERPRET=1) swaps these two
DTYPE = torch.bfloat16


def time_graph_us(fn, calls: int = 10, replays: int = 15) -> float:
    """Median time of one call, from CUDA-graph replays of `calls` back-to-back calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    del graph
    return statistics.median(times)


def time_eager_us(fn, reps: int = 30) -> float:
    """Median per-call time of back-to-back eager calls (includes Python and launch overhead)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return statistics.median(times)


def measure_copy_gbps(nbytes: int = 1 << 30) -> tuple[float, float]:
    """(device-to-device copy GB/s counting read + write, torch.sum read-only GB/s). The copy is the engine
    bench's own (`measure_copy_bandwidth_sync`, eager): captured in a graph a copy becomes a memcpy node that
    a copy engine runs, ~2.8 TB/s on an H200 against the SMs' ~4.3, which the engine's rooflines divide by."""
    copy_gbps = measure_copy_bandwidth_sync(torch.device(DEVICE), nbytes) / 1e9
    flat = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=DEVICE)
    sum_us = time_graph_us(lambda: flat.sum(dtype=torch.float32), calls=5, replays=10)
    return copy_gbps, nbytes / sum_us / 1e3


def build_inputs(shape: Shape, seed: int = 0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    if shape.ragged:
        lens = torch.randint(1, shape.context + 1, (shape.batch,), generator=gen, device=DEVICE)
    else:
        lens = torch.full((shape.batch,), shape.context, device=DEVICE)
    pages_per_seq = -(-shape.context // PAGE)
    owned = max(pages_per_seq, shape.row_pages)  # pages a sequence holds; per-head tables pick among them
    num_blocks = shape.batch * owned + 8
    if shape.head_major:
        kv = torch.randn(num_blocks, 2, shape.hkv, PAGE, shape.head_dim, generator=gen, device=DEVICE, dtype=DTYPE)
        kv = kv.transpose(2, 3)  # the same [num_blocks, 2, 16, Hkv, D] view, head-major underneath
    else:
        kv = torch.randn(num_blocks, 2, PAGE, shape.hkv, shape.head_dim, generator=gen, device=DEVICE, dtype=DTYPE)
    physical = torch.randperm(num_blocks, generator=gen, device=DEVICE)[: shape.batch * owned].view(shape.batch, owned)
    q = torch.randn(shape.batch, shape.hq, shape.head_dim, generator=gen, device=DEVICE, dtype=DTYPE)
    if shape.row_pages:
        tables = torch.full((shape.batch, shape.hkv, shape.max_blocks), -1, dtype=torch.int32, device=DEVICE)
        for h in range(shape.hkv):  # each head its own sorted choice, as the selection's ascending ids are
            pick = torch.rand(shape.batch, owned, generator=gen, device=DEVICE).argsort(dim=1)[:, :pages_per_seq]
            tables[:, h, :pages_per_seq] = physical.gather(1, pick.sort(dim=1).values).int()
        return q, kv, tables, lens[:, None].expand(-1, shape.hkv).contiguous().int()
    tables = torch.full((shape.batch, shape.max_blocks), -1, dtype=torch.int32, device=DEVICE)
    tables[:, :pages_per_seq] = physical[:, :pages_per_seq].int()
    return q, kv, tables, lens.int()


def kv_bytes(shape: Shape, lens: torch.Tensor) -> int:
    heads = 1 if lens.dim() == 2 else shape.hkv  # per-head lengths already count each head
    return int(lens.sum().item()) * heads * shape.head_dim * 2 * 2  # K and V, bf16


def candidate_configs(shape: Shape, heuristic: DecodeConfig, num_sms: int, best_tile=None) -> list[DecodeConfig]:
    if best_tile is None:  # phase 1: tiles at the heuristic split count, most promising first
        block_ns = (64, 32, 128) if shape.head_dim >= 128 else (128, 64, 256)
        ring_bytes = lambda bn, st: 2 * bn * shape.head_dim * 2 * max(1, st - 1)  # K+V cp.async ring
        tiles = [(bn, w, st, False) for st in (3, 4, 2) for w in (4, 8) for bn in block_ns]
        tiles = [t for t in tiles if ring_bytes(t[0], t[2]) <= 150 * 1024]
        tiles += [(heuristic.block_n, w, 1, False) for w in (4, 8)]  # no pipelining, occupancy only
        small, mid, large = sorted(block_ns)  # register prefetch; the sets that do not spill (sm_90)
        tiles += [(small, 4, 1, True), (mid, 8, 1, True), (small, 8, 1, True), (large, 8, 1, True)]
        return [DecodeConfig(bn, w, st, heuristic.num_splits, pf) for bn, w, st, pf in tiles]
    bn, w, st, pf = best_tile  # phase 2: split counts for the best tile
    max_tiles = -(-shape.max_blocks * PAGE // bn)
    splits = [s for s in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128) if s <= max_tiles]
    splits = [s for s in splits if shape.batch * shape.hkv * s <= 64 * num_sms]
    return [DecodeConfig(bn, w, st, s, pf) for s in splits]


def rel_err(got: torch.Tensor, expect: torch.Tensor) -> float:
    got, expect = got.float(), expect.float()
    return ((got - expect).norm(dim=-1) / expect.norm(dim=-1).clamp_min(1e-6)).max().item()


def bench_shape(shape: Shape, copy_gbps: float, deadline: float, log, cold: int = 1) -> list[dict]:
    """cold: input sets the timed calls take in turn (each its own KV pool), so that back-to-back calls read KV
    the L2 does not hold, as a decode step's attention does; 1 times every call on the same inputs."""
    sets = [build_inputs(shape, seed=i) for i in range(cold)]
    q, kv, tables, lens = sets[0]
    k_cache, v_cache = kv[:, 0], kv[:, 1]
    scale = shape.head_dim**-0.5
    nbytes = kv_bytes(shape, lens)
    expect = paged_decode_attention_reference(q, k_cache, v_cache, tables, lens, scale)
    num_sms = _num_sms(q.device)
    heuristic = choose_config(
        batch=shape.batch,
        num_kv_heads=shape.hkv,
        head_dim=shape.head_dim,
        page_size=PAGE,
        max_blocks=shape.max_blocks,
        num_sms=num_sms,
    )
    rows: list[dict] = []

    def run(config: DecodeConfig, tag: str) -> dict | None:
        if time.monotonic() > deadline:
            log(f"  SKIPPED (time budget) {tag} {config}")
            return None
        outs = [torch.full_like(q, float("nan")) for _ in sets]
        out = outs[0]
        calls = itertools.count()

        def fn() -> None:  # the first call takes set 0, the one `expect` was computed on
            i = next(calls) % len(sets)
            q_i, kv_i, tables_i, lens_i = sets[i]
            paged_decode_attention_triton(q_i, kv_i[:, 0], kv_i[:, 1], tables_i, lens_i, scale, out=outs[i],
                                          config=config)
        try:
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0  # includes compilation of a new tile
            err = rel_err(out, expect)
            us = time_graph_us(fn)
        except Exception as exc:  # a config that fails to compile or run is reported, not fatal
            log(f"  FAILED {tag} {config}: {type(exc).__name__}: {str(exc)[:300]}")
            return None
        row = dict(
            shape=shape.name,
            tag=tag,
            **asdict(config),
            us=us,
            gbps=nbytes / us / 1e3,
            frac_copy=nbytes / us / 1e3 / copy_gbps,
            err=err,
            ok=err <= 1e-2,
            first_call_s=first_s,
            cold=len(sets),
            programs=shape.batch * shape.hkv * config.num_splits,
        )
        log(
            f"  {tag:9s} bn={config.block_n:3d} w={config.num_warps} st={config.num_stages} "
            f"pf={int(config.prefetch)} splits={config.num_splits:3d} programs={row['programs']:6d}  {us:9.1f} us  "
            f"{row['gbps']:7.0f} GB/s  {100 * row['frac_copy']:5.1f}% copy  err={err:.1e}"
            f"  first={first_s:.1f}s{'' if row['ok'] else '  BAD'}"
        )
        rows.append(row)
        return row

    log(
        f"== {shape.name}: B={shape.batch} Hq={shape.hq} Hkv={shape.hkv} D={shape.head_dim} "
        f"ctx={'<=' if shape.ragged else ''}{shape.context} max_blocks={shape.max_blocks} "
        f"KV={nbytes / 1e9:.3f} GB"
    )
    if run(heuristic, "heuristic") is not None:
        eager = time_eager_us(lambda: paged_decode_attention(q, k_cache, v_cache, tables, lens, scale))
        log(f"  eager dispatcher (no graph, Python + launches included): {eager:.1f} us")
    if shape.sweep == "full":
        for config in candidate_configs(shape, heuristic, num_sms):
            if config != heuristic:
                run(config, "tile")
    ok = [r for r in rows if r["ok"]]
    best = min(ok, key=lambda r: r["us"]) if ok else None
    tile = (
        (best["block_n"], best["num_warps"], best["num_stages"], best["prefetch"])
        if best
        else (heuristic.block_n, heuristic.num_warps, heuristic.num_stages, heuristic.prefetch)
    )
    if shape.sweep in ("full", "splits"):
        for config in candidate_configs(shape, heuristic, num_sms, best_tile=tile):
            if all(asdict(config) != {k: r[k] for k in asdict(config)} for r in rows):
                run(config, "splits")
    return rows


def _cell(r: dict | None) -> str:
    if r is None:
        return f"{'-':25s} {'-':>8s} {'-':>6s} {'-':>6s} {'-':>6s}"
    cfg = f"{r['block_n']}/{r['num_warps']}w/{r['num_stages']}st/{r['num_splits']}sp{'/pf' if r['prefetch'] else ''}"
    return f"{cfg:25s} {r['us']:8.1f} {r['gbps']:6.0f} {100 * r['frac_copy']:5.1f}% {r['programs']:6d}"


def kernel_stats(log) -> None:
    """Registers, spills and shared memory of every compiled variant (Triton internals; best effort)."""
    from pulseio_engine.attention import _kernel

    for fn in (_kernel._paged_decode_split_kernel, _kernel._reduce_splits_kernel):
        try:
            for entry in fn.device_caches.values():
                for key, k in entry[0].items():
                    meta = k.metadata
                    log(
                        f"  {fn.__name__}: warps={meta.num_warps} stages={meta.num_stages} regs={k.n_regs} "
                        f"spills={k.n_spills} smem={meta.shared}  key={str(key)[-160:]}"
                    )
        except Exception as exc:
            log(f"  kernel stats unavailable for {getattr(fn, '__name__', fn)}: {type(exc).__name__}: {exc}")


def summary(rows: list[dict], shapes: list[Shape]) -> str:
    lines = [
        "",
        "SUMMARY (graph-replayed, bf16, KV GB/s; %copy = fraction of measured D2D copy bandwidth)",
        f"{'shape':28s} | {'heuristic cfg':25s} {'us':>8s} {'GB/s':>6s} {'%copy':>6s} {'progs':>6s} | "
        f"{'best cfg':25s} {'us':>8s} {'GB/s':>6s} {'%copy':>6s} {'progs':>6s} | bad",
    ]
    for shape in shapes:
        mine = [r for r in rows if r["shape"] == shape.name]
        heur = next((r for r in mine if r["tag"] == "heuristic"), None)
        ok = [r for r in mine if r["ok"]]
        best = min(ok, key=lambda r: r["us"]) if ok else None
        bad = sum(not r["ok"] for r in mine)
        lines.append(f"{shape.name:28s} | {_cell(heur)} | {_cell(best)} | {bad}")
    lines.append("cfg = block_n / num_warps / num_stages / num_splits [/pf = register prefetch variant]")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=80.0, help="stop starting new configs after this")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for bench_attention.jsonl")
    parser.add_argument("--shapes", default="", help="comma-separated substrings of shape names to run")
    parser.add_argument("--cold", type=int, default=1, help="input sets the timed calls take in turn (3: KV the L2 "
                        "does not hold, as in a decode step); default 1, every call on the same inputs")
    args = parser.parse_args()
    if args.cold < 1:
        parser.error(f"--cold wants at least 1 input set, got {args.cold}")
    if not torch.cuda.is_available():
        print("bench_attention: no CUDA device; nothing to measure", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.budget_s
    os.makedirs(args.out, exist_ok=True)
    log_file = open(os.path.join(args.out, "bench_attention.log"), "w")

    def log(line: str) -> None:
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    import triton

    props = torch.cuda.get_device_properties(0)
    log(
        f"device {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
        f"triton {triton.__version__}"
    )
    copy_gbps, read_gbps = measure_copy_gbps()
    log(f"D2D copy 1 GiB: {copy_gbps:.0f} GB/s (read + write); torch.sum bf16 read-only: {read_gbps:.0f} GB/s")
    wanted = [s for s in args.shapes.split(",") if s]
    shapes = [s for s in SHAPES if not wanted or any(w in s.name for w in wanted)]
    rows: list[dict] = []
    for shape in shapes:
        if time.monotonic() > deadline:
            log(f"== {shape.name}: SKIPPED (time budget)")
            continue
        try:
            rows += bench_shape(shape, copy_gbps, deadline, log, cold=args.cold)
            torch.cuda.empty_cache()  # the shape's tensors died with bench_shape's frame
        except Exception as exc:  # one broken shape must not hide the others
            log(f"== {shape.name}: FAILED {type(exc).__name__}: {str(exc)[:500]}")
            torch.cuda.empty_cache()
    log("== compiled kernels")
    kernel_stats(log)
    with open(os.path.join(args.out, "bench_attention.jsonl"), "w") as f:
        f.write(json.dumps({"copy_gbps": copy_gbps, "read_gbps": read_gbps, "device": props.name}) + "\n")
        for row in rows:
            f.write(json.dumps(row) + "\n")
    log(summary(rows, shapes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
