"""numba CUDA kernels that move whole blocks: one kernel serves gather, scatter and zero-copy.

`copy_blocks(src, src_ids, dst, dst_ids, n)` copies row `src_ids[b]` of `src` to row `dst_ids[b]` of
`dst` for b < n. Rows are blocks viewed as uint64 words. `src` or `dst` may be pinned host memory
seen through UVA (the zero-copy route) or device memory (scatter from a staging buffer, gather
into one). CTAs stride over blocks, so the grid size is the route's CTA budget: the kernel never
takes more SMs than it was given, whatever `n` is.

Each thread keeps `_UNROLL` loads in flight before storing: over PCIe a load takes about a
microsecond, so memory-level parallelism, not instruction count, sets the rate. For the same reason
a CTA fetches its next block's ids before copying the current block: on the zero-copy route the ids
live in pinned host memory, and a dependent id load per block would add a PCIe round trip to each.
"""

from __future__ import annotations

import functools

from numba import cuda  # noqa: E402

from . import _numba_compat  # noqa: F401  (must precede numba.cuda)

THREADS_PER_CTA = 256
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


def _copy_blocks(src, src_ids, dst, dst_ids, n):  # pragma: no cover - runs on the GPU / simulator
    b = cuda.blockIdx.x
    s = src_ids[b] if b < n else 0
    d = dst_ids[b] if b < n else 0
    while b < n:
        following = b + cuda.gridDim.x
        s_next = src_ids[following] if following < n else 0
        d_next = dst_ids[following] if following < n else 0
        copy_row(src, s, dst, d)
        b, s, d = following, s_next, d_next


@functools.cache
def compile_copy_blocks():
    """The kernel compiled for COPY_BLOCKS_SIGNATURE, once per process (lazily: compiling needs a GPU
    or the simulator); every DmaEngine's routes share it instead of compiling their own."""
    return cuda.jit(COPY_BLOCKS_SIGNATURE)(_copy_blocks)
