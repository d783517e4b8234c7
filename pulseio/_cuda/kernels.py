"""numba CUDA kernels that move whole blocks: one kernel serves gather, scatter and zero-copy.

`copy_blocks(src, src_ids, dst, dst_ids, n)` copies row `src_ids[b]` of `src` to row `dst_ids[b]` of
`dst` for b < n. Rows are blocks viewed as uint64 words. `src` or `dst` may be pinned host memory
seen through UVA (the zero-copy route) or device memory (scatter from a staging buffer, gather
into one). The grid size is the route's CTA budget: the kernel never
takes more SMs than it was given, whatever `n` is.

Each thread keeps `_UNROLL` loads in flight before storing: over PCIe a load takes about a
microsecond, so memory-level parallelism, not instruction count, sets the rate.

Work is split into pieces of `CHUNK_WORDS` words (8 KiB: one round of a CTA's loads; a row shorter than
that, or a row's remainder, is a piece of its own), and each CTA copies one contiguous span of pieces,
so CTAs differ by at most one piece, not one row: 104 rows of 64 KiB over 64 CTAs left 40 CTAs with two
rows and 24 with one, and the copy ran at the pace of the 40. Each CTA first reads its rows' ids into
shared memory, one coalesced load per `IDS_PER_ROUND` ids. On the zero-copy and resident routes the ids live in
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
CHUNK_WORDS = THREADS_PER_CTA * _UNROLL  # uint64 words of one piece: 8 KiB

COPY_BLOCKS_SIGNATURE = "void(uint64[:, ::1], int64[::1], uint64[:, ::1], int64[::1], int64)"


@cuda.jit(device=True)
def copy_piece(src, s, dst, d, w0, w1):  # pragma: no cover - runs on the GPU / simulator
    """Every thread of the CTA: words [w0, w1) of row s of src -> row d of dst; a whole piece
    (CHUNK_WORDS with THREADS_PER_CTA threads) keeps _UNROLL loads in flight per thread."""
    bd = cuda.blockDim.x
    w = w0 + cuda.threadIdx.x
    if w1 - w0 == bd * _UNROLL:
        v0 = src[s, w]
        v1 = src[s, w + bd]
        v2 = src[s, w + 2 * bd]
        v3 = src[s, w + 3 * bd]
        dst[d, w] = v0
        dst[d, w + bd] = v1
        dst[d, w + 2 * bd] = v2
        dst[d, w + 3 * bd] = v3
        return
    while w < w1:
        dst[d, w] = src[s, w]
        w += bd


@cuda.jit(device=True)
def copy_span(a, a_ids, a_at, b, b_ids, b_at, lo, hi, reverse, staged):  # pragma: no cover - GPU / simulator
    """Every thread of the CTA: pieces lo..hi-1 (see `span_of`) of rows a_ids[a_at + i] of a -> rows
    b_ids[b_at + i] of b (b -> a if reverse). staged: shared [2, IDS_PER_ROUND] int64, where the rows'
    ids are read first, coalesced."""
    words = a.shape[1]
    chunk = cuda.blockDim.x * _UNROLL
    per_row = (words + chunk - 1) // chunk
    while lo < hi:
        row0 = lo // per_row
        m = min((hi - 1) // per_row + 1 - row0, staged.shape[1])
        i = cuda.threadIdx.x
        while i < m:
            staged[0, i] = a_ids[a_at + row0 + i]
            staged[1, i] = b_ids[b_at + row0 + i]
            i += cuda.blockDim.x
        cuda.syncthreads()
        stop = min(hi, (row0 + m) * per_row)
        for p in range(lo, stop):
            j = p // per_row - row0
            w0 = (p - (row0 + j) * per_row) * chunk
            w1 = min(w0 + chunk, words)
            if reverse:
                copy_piece(b, staged[1, j], a, staged[0, j], w0, w1)
            else:
                copy_piece(a, staged[0, j], b, staged[1, j], w0, w1)
        cuda.syncthreads()  # every thread is done with these ids before the next round overwrites them
        lo = stop


@cuda.jit(device=True)
def span_of(cta, ctas, n, words):  # pragma: no cover - GPU / simulator
    """The pieces CTA `cta` of `ctas` copies of n rows of `words` words: a contiguous [lo, hi) of piece
    indices, sizes differing by at most 1. Piece p is row p // per_row, its (p % per_row)-th chunk."""
    chunk = cuda.blockDim.x * _UNROLL
    total = n * ((words + chunk - 1) // chunk)
    return cta * total // ctas, (cta + 1) * total // ctas


def pieces(n: int, words: int) -> int:
    """How many pieces n rows of `words` words are cut into at THREADS_PER_CTA threads: the most CTAs
    a copy of them can use."""
    return n * -(-words // CHUNK_WORDS)


def _copy_blocks(src, src_ids, dst, dst_ids, n):  # pragma: no cover - runs on the GPU / simulator
    staged = cuda.shared.array((2, IDS_PER_ROUND), int64)
    lo, hi = span_of(cuda.blockIdx.x, cuda.gridDim.x, n, src.shape[1])
    copy_span(src, src_ids, 0, dst, dst_ids, 0, lo, hi, False, staged)


@functools.cache
def compile_copy_blocks():
    """The kernel compiled for COPY_BLOCKS_SIGNATURE, once per process (lazily: compiling needs a GPU
    or the simulator); every DmaEngine's routes share it instead of compiling their own."""
    return cuda.jit(COPY_BLOCKS_SIGNATURE)(_copy_blocks)
