"""numba CUDA kernels that move whole blocks: one kernel serves gather, scatter and zero-copy.

`copy_blocks(src, src_ids, dst, dst_ids, n)` copies row `src_ids[b]` of `src` to row `dst_ids[b]` of
`dst` for b < n. Rows are blocks viewed as uint64 words. `src` or `dst` may be pinned host memory
seen through UVA (the zero-copy route) or device memory (scatter from a staging buffer, gather
into one). The grid size is the route's CTA budget: the kernel never
takes more SMs than it was given, whatever `n` is.

Each thread keeps `_UNROLL` loads in flight before storing: over PCIe a load takes about a
microsecond, so memory-level parallelism, not instruction count, sets the rate.

Each CTA copies one contiguous span of the blocks and first reads the span's ids into shared memory,
one coalesced load per `IDS_PER_ROUND` ids. A transfer whose blocks do not divide evenly over the CTAs cuts
each block into `parts_of` parts and spreads those instead: a recall of 3 blocks over 16 CTAs has each CTA
copy 3/16 of a block, not 3 CTAs each making a whole block's round trips while the rest idle.

On the zero-copy and resident routes the ids live in pinned host memory: read one by one, by every
warp, each 8-byte id costs a whole PCIe completion: staged in shared memory, they cost one a round.
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
def copy_words(src, s, dst, d, lo, hi):  # pragma: no cover - runs on the GPU / simulator
    """Every thread of the CTA: words [lo, hi) of row s of src -> the same words of row d of dst, _UNROLL loads
    in flight per thread; the last pass (fewer than _UNROLL strides of words) guards each word and still issues
    every load before its stores."""
    b = cuda.blockDim.x
    stride = b * _UNROLL
    full = hi - (hi - lo) % stride
    w = lo + cuda.threadIdx.x
    while w < full:
        v0 = src[s, w]
        v1 = src[s, w + b]
        v2 = src[s, w + 2 * b]
        v3 = src[s, w + 3 * b]
        dst[d, w] = v0
        dst[d, w + b] = v1
        dst[d, w + 2 * b] = v2
        dst[d, w + 3 * b] = v3
        w += stride
    if w < hi:  # a word past hi is never read: its load falls back to v0 (the same type, not a literal)
        v0 = src[s, w]
        v1 = src[s, w + b] if w + b < hi else v0
        v2 = src[s, w + 2 * b] if w + 2 * b < hi else v0
        v3 = src[s, w + 3 * b] if w + 3 * b < hi else v0
        dst[d, w] = v0
        if w + b < hi:
            dst[d, w + b] = v1
        if w + 2 * b < hi:
            dst[d, w + 2 * b] = v2
        if w + 3 * b < hi:
            dst[d, w + 3 * b] = v3


@cuda.jit(device=True)
def parts_of(ctas, n):  # pragma: no cover - runs on the GPU / simulator
    """The parts each block of an n-block transfer is cut into for `ctas` CTAs: 1 where n is a multiple of ctas,
    else ctas, so that every CTA copies n / ctas blocks' worth. Spans of whole blocks would leave some CTAs a
    block more than others (19 blocks over 16 CTAs: two blocks' round trips, not 1.2) and a short transfer's
    other CTAs idle. A CTA copies its units of one block as one run of words (`copy_staged`)."""
    return 1 if n <= 0 or n % ctas == 0 else ctas


@cuda.jit(device=True)
def part_words(words, part, parts):  # pragma: no cover - runs on the GPU / simulator
    """The words [lo, hi) of a row of `words` words that part `part` of `parts` covers."""
    return part * words // parts, (part + 1) * words // parts


@cuda.jit(device=True)
def block_words(words, u, end, parts):  # pragma: no cover - runs on the GPU / simulator
    """Units [u, v) of [u, end) that belong to block u // parts, and the one contiguous run of a row's `words`
    words they cover: (v, w0, w1)."""
    v = min(end, (u // parts + 1) * parts)
    return v, part_words(words, u % parts, parts)[0], part_words(words, (v - 1) % parts, parts)[1]


@cuda.jit(device=True)
def round_rows(lo, hi, parts, cap):  # pragma: no cover - runs on the GPU / simulator
    """How many blocks units [lo, hi) (part u % parts of block u // parts) touch, at most `cap`: the ids one
    round stages, from block lo // parts on."""
    return 0 if lo >= hi else min((hi - 1) // parts + 1 - lo // parts, cap)


@cuda.jit(device=True)
def copy_staged(a, b, staged, r0, lo, end, parts, reverse):  # pragma: no cover - runs on the GPU / simulator
    """Every thread of the CTA: units [lo, end) of a transfer (unit u: part u % parts of block u // parts), the ids
    of whose blocks from block r0 on are staged: those words of row staged[0, u // parts - r0] of a -> row
    staged[1, u // parts - r0] of b (b -> a if reverse), one run of words (`block_words`) a block."""
    words = a.shape[1]
    u = lo
    while u < end:
        j = u // parts - r0
        v, w0, w1 = block_words(words, u, end, parts)
        if reverse:
            copy_words(b, staged[1, j], a, staged[0, j], w0, w1)
        else:
            copy_words(a, staged[0, j], b, staged[1, j], w0, w1)
        u = v


@cuda.jit(device=True)
def copy_span(a, a_ids, a_at, b, b_ids, b_at, lo, hi, parts, reverse, staged):  # pragma: no cover - GPU / simulator
    """Every thread of the CTA: units lo..hi-1 of a transfer, unit u being part u % parts of block u // parts:
    those words of row a_ids[a_at + u // parts] of a -> row b_ids[b_at + u // parts] of b (b -> a if reverse).
    staged: shared [2, IDS_PER_ROUND] int64, where the blocks' ids are read first, coalesced."""
    while lo < hi:
        r0 = lo // parts
        m = round_rows(lo, hi, parts, staged.shape[1])
        i = cuda.threadIdx.x
        while i < m:
            staged[0, i] = a_ids[a_at + r0 + i]
            staged[1, i] = b_ids[b_at + r0 + i]
            i += cuda.blockDim.x
        cuda.syncthreads()
        end = min(hi, (r0 + m) * parts)
        copy_staged(a, b, staged, r0, lo, end, parts, reverse)
        cuda.syncthreads()  # every thread is done with these ids before the next round overwrites them
        lo = end


@cuda.jit(device=True)
def span_of(cta, ctas, n):  # pragma: no cover - GPU / simulator
    """The units CTA `cta` of `ctas` copies out of n: a contiguous [lo, hi), sizes differing by at most 1."""
    return cta * n // ctas, (cta + 1) * n // ctas


def _copy_blocks(src, src_ids, dst, dst_ids, n):  # pragma: no cover - runs on the GPU / simulator
    staged = cuda.shared.array((2, IDS_PER_ROUND), int64)
    parts = parts_of(cuda.gridDim.x, n)
    lo, hi = span_of(cuda.blockIdx.x, cuda.gridDim.x, n * parts)
    copy_span(src, src_ids, 0, dst, dst_ids, 0, lo, hi, parts, False, staged)


@functools.cache
def compile_copy_blocks():
    """The kernel compiled for COPY_BLOCKS_SIGNATURE, once per process (lazily: compiling needs a GPU
    or the simulator); every DmaEngine's routes share it instead of compiling their own."""
    return cuda.jit(COPY_BLOCKS_SIGNATURE)(_copy_blocks)
