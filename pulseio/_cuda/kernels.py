"""numba CUDA kernels that move whole blocks: one kernel serves gather, scatter and zero-copy.

`copy_blocks(src, src_ids, dst, dst_ids, n)` copies row `src_ids[b]` of `src` to row `dst_ids[b]` of
`dst` for b < n. Rows are blocks viewed as uint64 words. `src` or `dst` may be pinned host memory
seen through UVA (the zero-copy route) or device memory (scatter from a staging buffer, gather
into one). The grid size is the route's CTA budget: the kernel never
takes more SMs than it was given, whatever `n` is.

Each thread keeps `_UNROLL` loads in flight before storing: over PCIe a load takes about a
microsecond, so memory-level parallelism, not instruction count, sets the rate.

Each CTA copies one contiguous span of the blocks and first reads the span's ids into shared memory,
one coalesced load per `IDS_PER_ROUND` ids. On the zero-copy and resident routes the ids live in
pinned host memory: read one by one, by every warp, each 8-byte id costs a whole PCIe completion.
On the H200 that held 4096 x 8 KiB H2D at 0.89 of the link (64 KiB blocks, and D2H, whose ids
travel against the data, reached 0.92-0.93); staged, it moves 0.90-0.91.
"""

from __future__ import annotations

import functools

from numba import cuda, int64  # noqa: E402

from . import _numba_compat  # noqa: F401  (must precede numba.cuda)

THREADS_PER_CTA = 256
IDS_PER_ROUND = THREADS_PER_CTA  # ids a CTA stages in shared memory at a time (2 x 2 KiB)
_UNROLL = 4

COPY_BLOCKS_SIGNATURE = "void(uint64[:, ::1], int64[::1], uint64[:, ::1], int64[::1], int64)"


@cuda.jit(device=True)
def copy_row(src, s, dst, d):  # pragma: no cover - runs on the GPU / simulator
    """Every thread of the CTA: row s of src -> row d of dst, _UNROLL loads in flight per thread."""
    words = src.shape[1]
    stride = cuda.blockDim.x * _UNROLL
    full = words - words % stride
    w = cuda.threadIdx.x
    while w < full:
        v0 = src[s, w]
        v1 = src[s, w + cuda.blockDim.x]
        v2 = src[s, w + 2 * cuda.blockDim.x]
        v3 = src[s, w + 3 * cuda.blockDim.x]
        dst[d, w] = v0
        dst[d, w + cuda.blockDim.x] = v1
        dst[d, w + 2 * cuda.blockDim.x] = v2
        dst[d, w + 3 * cuda.blockDim.x] = v3
        w += stride
    while w < words:
        dst[d, w] = src[s, w]
        w += cuda.blockDim.x


@cuda.jit(device=True)
def copy_span(a, a_ids, a_at, b, b_ids, b_at, lo, hi, reverse, staged):  # pragma: no cover - GPU / simulator
    """Every thread of the CTA: for i in lo..hi-1, row a_ids[a_at + i] of a -> row b_ids[b_at + i] of b
    (b -> a if reverse). staged: shared [2, IDS_PER_ROUND] int64, where the ids are read first, coalesced."""
    while lo < hi:
        m = min(hi - lo, staged.shape[1])
        i = cuda.threadIdx.x
        while i < m:
            staged[0, i] = a_ids[a_at + lo + i]
            staged[1, i] = b_ids[b_at + lo + i]
            i += cuda.blockDim.x
        cuda.syncthreads()
        for j in range(m):
            if reverse:
                copy_row(b, staged[1, j], a, staged[0, j])
            else:
                copy_row(a, staged[0, j], b, staged[1, j])
        cuda.syncthreads()  # every thread is done with these ids before the next round overwrites them
        lo += m


@cuda.jit(device=True)
def span_of(cta, ctas, n):  # pragma: no cover - GPU / simulator
    """The blocks CTA `cta` of `ctas` copies out of n: a contiguous [lo, hi), sizes differing by at most 1."""
    return cta * n // ctas, (cta + 1) * n // ctas


def _copy_blocks(src, src_ids, dst, dst_ids, n):  # pragma: no cover - runs on the GPU / simulator
    staged = cuda.shared.array((2, IDS_PER_ROUND), int64)
    lo, hi = span_of(cuda.blockIdx.x, cuda.gridDim.x, n)
    copy_span(src, src_ids, 0, dst, dst_ids, 0, lo, hi, False, staged)


@functools.cache
def compile_copy_blocks():
    """The kernel compiled for COPY_BLOCKS_SIGNATURE, once per process (lazily: compiling needs a GPU
    or the simulator); every DmaEngine's routes share it instead of compiling their own."""
    return cuda.jit(COPY_BLOCKS_SIGNATURE)(_copy_blocks)
