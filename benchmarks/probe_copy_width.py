"""How the SM copy of scattered 64 KiB units from pinned host memory depends on its load width, loads in
flight per thread, threads per CTA and the read-only path: one layer's recall (104 units) and a long one.

    PYTHONPATH=. python benchmarks/probe_copy_width.py --json out.json [--reps 20]

Each variant is a plain kernel (no task ring): CTA c copies units [c n / C, (c + 1) n / C), ids staged
in device memory, every thread `unroll` loads of `width` bytes in flight before it stores them. Timed by
events around the kernel, enqueued behind a GPU sleep so the launch is not in the time; fresh random ids
per repetition; the last repetition's data checked bit for bit. `copy_blocks` is pulseio's kernel
(8-byte loads, 4 in flight, 256 threads) on the same ids, for reference. Rates are fractions of a
512 MiB contiguous H2D copy in the same run.
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
from pulseio._cuda import _numba_compat  # noqa: E402,F401
from numba import cuda, types  # noqa: E402
from numba.cuda.extending import intrinsic  # noqa: E402
from llvmlite import ir  # noqa: E402

from pulseio._cuda.kernels import compile_copy_blocks  # noqa: E402
from pulseio.bench.records import git_sha  # noqa: E402

UNIT = 64 << 10
_I64 = ir.IntType(64)


def chunk_asm(width: int, unroll: int, threads: int, nc: bool) -> str:
    """PTX: `unroll` loads of `width` bytes at [$0 + j * threads * width], then the stores at [$1 + ...]."""
    ld = "ld.global.nc" if nc else "ld.global"
    regs = unroll * (width // 8)
    lines = [f".reg .b64 r<{regs}>;"]
    for j in range(unroll):
        off = j * threads * width
        if width == 16:
            lines.append(f"{ld}.v2.u64 {{r{2 * j}, r{2 * j + 1}}}, [$0+{off}];")
        else:
            lines.append(f"{ld}.u64 r{j}, [$0+{off}];")
    for j in range(unroll):
        off = j * threads * width
        if width == 16:
            lines.append(f"st.global.v2.u64 [$1+{off}], {{r{2 * j}, r{2 * j + 1}}};")
        else:
            lines.append(f"st.global.u64 [$1+{off}], r{j};")
    return "{ " + " ".join(lines) + " }"


def make_kernel(width: int, unroll: int, threads: int, nc: bool):
    text = chunk_asm(width, unroll, threads, nc)

    @intrinsic
    def chunk(typingctx, src, dst):
        def codegen(context, builder, sig, args):
            fn = ir.FunctionType(ir.VoidType(), [_I64, _I64])
            builder.call(ir.InlineAsm(fn, text, "l,l,~{memory}", side_effect=True), list(args))
            return context.get_dummy_value()

        return types.void(types.int64, types.int64), codegen

    step = threads * width * unroll
    assert UNIT % step == 0, (width, unroll, threads)

    @cuda.jit("void(int64, int64, int64[::1], int64[::1], int64)")
    def copy(host_base, dev_base, ids, slots, n):
        c, grid, t = cuda.blockIdx.x, cuda.gridDim.x, cuda.threadIdx.x
        lo, hi = c * n // grid, (c + 1) * n // grid
        for b in range(lo, hi):
            s = host_base + ids[b] * UNIT + t * width
            d = dev_base + slots[b] * UNIT + t * width
            off = 0
            while off < UNIT:
                chunk(s + off, d + off)
                off += step

    return copy


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


def cai(ptr: int, shape: tuple[int, ...], typestr: str):
    class A:
        __cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3,
                                    "strides": None}
    return cuda.as_cuda_array(A())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--host-units", type=int, default=32768)
    p.add_argument("--counts", default="104,4096")
    p.add_argument("--only", default=None, help="comma-separated kernel names (default: all)")
    p.add_argument("--ctas", default="64,128")
    p.add_argument("--pool", choices=["torch", "pulseio", "thp"], default="torch",
                   help="host memory: torch's pinned allocation (cudaHostAlloc), a pulseio.HostPool (as the engine's), "
                        "or anonymous memory advised to transparent huge pages, then registered")
    args = p.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    torch.cuda.init()
    if args.pool == "torch" and args.host_units <= 32768:
        host = torch.randint(-2**62, 2**62, (args.host_units, UNIT // 8), dtype=torch.int64).pin_memory()
    elif args.pool == "torch":
        host = torch.empty((args.host_units, UNIT // 8), dtype=torch.int64, pin_memory=True)
        host[:, ::512] = torch.arange(args.host_units * 16, dtype=torch.int64).view(args.host_units, 16)
    elif args.pool == "thp":
        import ctypes
        import mmap
        from cuda.bindings import driver as cu

        from pulseio._cuda import driver
        nbytes, huge = args.host_units * UNIT, 2 << 20
        mm = mmap.mmap(-1, nbytes + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        skip = (-base) % huge
        mm.madvise(mmap.MADV_HUGEPAGE, skip, nbytes)
        raw = torch.frombuffer(mm, dtype=torch.uint8)[skip:skip + nbytes]
        raw.zero_()
        driver.init()
        driver.set_current(driver.primary_context(torch.cuda.current_device()))
        for start in range(0, nbytes, 1 << 30):
            driver.check("cuMemHostRegister", cu.cuMemHostRegister(raw.data_ptr() + start, min(1 << 30, nbytes - start),
                                                                   cu.CU_MEMHOSTREGISTER_DEVICEMAP))
        host = raw.view(torch.int64).view(args.host_units, UNIT // 8)
        host[:, ::512] = torch.arange(args.host_units * 16, dtype=torch.int64).view(args.host_units, 16)
        print(open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip(),
              [line for line in open("/proc/meminfo") if "AnonHuge" in line])
    else:
        import pulseio
        pool = pulseio.HostPool(pulseio.open_backend("cuda"), num_blocks=args.host_units, block_bytes=UNIT)
        host = pool.view(torch.int64, UNIT // 8)
        host[:, ::512] = torch.arange(args.host_units * 16, dtype=torch.int64).view(args.host_units, 16)
    dev = torch.zeros(max(counts), UNIT // 8, dtype=torch.int64, device="cuda")
    peak = link_peak()
    stream = torch.cuda.Stream()
    rng = np.random.default_rng(0)
    host_arr = cai(host.data_ptr(), tuple(host.shape), "<u8")
    dev_arr = cai(dev.data_ptr(), tuple(dev.shape), "<u8")
    reference = compile_copy_blocks()
    variants = [(8, 4, 256, False), (16, 4, 256, False), (16, 4, 256, True), (16, 8, 256, False),
                (16, 8, 256, True), (16, 4, 512, True), (8, 8, 512, False), (16, 2, 1024, True),
                (16, 4, 1024, True)]
    kernels = {"copy_blocks": None, **{f"w{w}_u{u}_t{t}{'_nc' if nc else ''}": (make_kernel(w, u, t, nc), t)
                                       for w, u, t, nc in variants}}
    if args.only:
        kernels = {k: v for k, v in kernels.items() if k in args.only.split(",")}
    out: dict = {"git_sha": git_sha(), "device": torch.cuda.get_device_name(), "date": time.strftime("%F %T"),
                 "peak_gbps": peak, "rows": []}
    for ctas in (int(c) for c in args.ctas.split(",")):
        for n in counts:
            for name, spec in kernels.items():
                secs = []
                for rep in range(args.reps + 1):
                    ids = torch.from_numpy(rng.choice(args.host_units, size=n, replace=False)).cuda()
                    slots = torch.from_numpy(rng.permutation(n)).cuda()
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    with torch.cuda.stream(stream):
                        torch.cuda._sleep(1_000_000)
                        a.record()
                        ns = cuda.external_stream(stream.cuda_stream)
                        if spec is None:
                            reference[ctas, 256, ns](host_arr, cuda.as_cuda_array(ids), dev_arr,
                                                     cuda.as_cuda_array(slots), n)
                        else:
                            kernel, threads = spec
                            kernel[ctas, threads, ns](host.data_ptr(), dev.data_ptr(), cuda.as_cuda_array(ids),
                                                      cuda.as_cuda_array(slots), n)
                        b.record()
                    b.synchronize()
                    if rep:   # the first is the warm-up (and compile)
                        secs.append(a.elapsed_time(b) / 1e3)
                exact = bool(torch.equal(dev[slots.cpu()].cpu(), host[ids.cpu()]))
                p50 = float(np.median(secs))
                row = {"ctas": ctas, "units": n, "kernel": name, "p50_us": p50 * 1e6,
                       "p10_us": float(np.percentile(secs, 10)) * 1e6, "gbps": n * UNIT / p50 / 1e9,
                       "of_peak": n * UNIT / p50 / 1e9 / peak, "bit_exact_last": exact}
                out["rows"].append(row)
                print(f"ctas {ctas:3d} n {n:5d} {name:18s} {row['p50_us']:8.1f} us  {row['gbps']:5.1f} GB/s "
                      f"({row['of_peak']:.3f})  exact {exact}", flush=True)
    print(f"peak {peak:.1f} GB/s, host pool {args.pool} {args.host_units * UNIT / 2**30:.0f} GiB")
    args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
