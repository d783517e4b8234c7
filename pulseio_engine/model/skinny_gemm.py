"""`skinny_linear`: out = x @ weight.T for decode's few rows (M <= 32), one Triton launch per call.

Decode's projections read a weight of N x K and multiply it by M <= 32 token rows, so they are bounded
by reading the weight from HBM once. Each program owns BLOCK_N weight rows (the "swapped" product: the
weight tile is the dot's left operand, x.T its [BLOCK_K, M_PAD] right one, so the MMA's long side is N) and
streams them over its share of K, accumulating in fp32. Rows of x past M are masked to zero up to M_PAD
(16, tl.dot's smallest side, or 32); `use_dot=False` does the same product as a broadcast multiply and a sum
instead.

Split-K in one launch. Narrow N (o_proj, down) gives too few row blocks to keep 132 SMs reading, so K is
split over `split_k` programs per row block. cuBLAS then launches a memset and a reduce kernel; here the
grid is (row blocks, splits) and the reduction happens in the same launch:
  1. every program stores its fp32 partial tile in `workspace.partials[split, :M, cols]`;
  2. a CTA barrier, one atomic add (acq_rel, gpu scope) on its row block's int32 counter, a barrier again
     (CUTLASS's semaphore pattern): the release publishes every thread's partial, the acquire makes the
     earlier arrivals' partials visible, read back through L2 (.cg loads);
  3. the program whose add returns `split_k - 1` arrived last: it sums the partials in split order
     0, 1, ... (the result does not depend on which program came last: bitwise deterministic), writes
     the output in x's dtype, and stores 0 into the counter.
The counters are thus zero between calls, so the workspace is reused with no memset: a CUDA graph holds
one kernel node per call, not memset + gemm + reduce. A workspace may be shared by every call issued on
one stream (size it for the largest N and split_k); two streams running at once need one each.
Under TRITON_INTERPRET=1 programs run one after another, so the tests there check the arithmetic and the
counters' reset, not the memory ordering; that is for the GPU tests.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_ROWS = 32  # rows of x one call takes
MIN_DOT_ROWS = 16  # tl.dot's smallest side: fewer rows are padded to it
_DTYPES = (torch.bfloat16, torch.float16)
_DEFAULT_NUM_SMS = 132  # an H200's; what CPU (interpreter) runs assume, so they pick a GPU's configs


@dataclass(frozen=True)
class SkinnyConfig:
    """One launch configuration. `split_k == 1`: each program loops over all of K (no workspace)."""

    block_n: int  # weight rows (output columns) per program, power of two >= 16
    block_k: int  # K elements per loop iteration, power of two >= 16
    split_k: int  # programs sharing one row block's K (fewer run when K has fewer BLOCK_K tiles)
    num_warps: int
    num_stages: int
    use_dot: bool = True  # tl.dot on rows padded to M_PAD; False: broadcast multiply + tl.sum

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")
        if not 1 <= self.split_k <= 64:
            raise ValueError(f"split_k must be in [1, 64], got {self.split_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")


@dataclass(frozen=True)
class SkinnyWorkspace:
    """Scratch for split-K calls; counters must be zero when handed over (`allocate` does that)."""

    partials: torch.Tensor  # [max_split_k, MAX_ROWS, max_n] float32: one partial tile per split
    counters: torch.Tensor  # [cdiv(max_n, 16)] int32: arrivals per row block, zero between calls

    def __post_init__(self) -> None:
        p, c = self.partials, self.counters
        if p.dtype != torch.float32 or p.dim() != 3 or p.shape[1] != MAX_ROWS or p.stride(2) != 1:
            raise ValueError(f"partials must be [splits, {MAX_ROWS}, N] float32 with unit last stride, "
                             f"got {list(p.shape)} {p.dtype}; use SkinnyWorkspace.allocate")
        if c.dtype != torch.int32 or c.dim() != 1 or not c.is_contiguous() or c.device != p.device:
            raise ValueError(f"counters must be a contiguous [n] int32 tensor on {p.device}, got "
                             f"{list(c.shape)} {c.dtype} on {c.device}; use SkinnyWorkspace.allocate")

    @classmethod
    def allocate(cls, max_n: int, *, max_split_k: int, device: torch.device | str) -> SkinnyWorkspace:
        """Room for any call with N <= max_n, split_k <= max_split_k and block_n >= 16."""
        return cls(torch.empty((max_split_k, MAX_ROWS, max_n), dtype=torch.float32, device=device),
                   torch.zeros(triton.cdiv(max_n, 16), dtype=torch.int32, device=device))


def default_split_k(n: int, k: int, block_n: int, block_k: int, sm_count: int) -> int:
    """1, 2, 4 or 8: doubled while there are fewer than 2 programs per SM and each split keeps >= 4 K tiles."""
    row_blocks, k_tiles = triton.cdiv(n, block_n), triton.cdiv(k, block_k)
    split_k = 1
    while split_k < 8 and row_blocks * split_k < 2 * sm_count and k_tiles >= 4 * 2 * split_k:
        split_k *= 2
    return split_k


@functools.lru_cache(maxsize=256)
def default_config(m: int, n: int, k: int, sm_count: int) -> SkinnyConfig:
    """The tile for a shape, by a rule read off benchmarks/bench_skinny_gemm.py's sweep on an H200 (qwen3-14b's
    projections, M = 1, 8, 16, 32): the widest row block (128, then 32) that still gives the SMs a few programs each
    with K unsplit, else 64-row blocks with K split until there are two programs an SM. Tiles hold 8192 weight
    elements (16 KiB in bf16), 16384 with 8 warps and 4 stages once 128-row blocks run many waves (the lm_head).
    `m` is unused: every M <= 32 reads the same weight."""
    del m
    row_blocks = triton.cdiv(n, 128)
    if row_blocks >= 2 * sm_count:
        many_waves = row_blocks >= 4 * sm_count
        return SkinnyConfig(128, 128 if many_waves else 64, 1, num_warps=8, num_stages=4 if many_waves else 3)
    if 2 * triton.cdiv(n, 32) >= 3 * sm_count:
        return SkinnyConfig(32, 256, 1, num_warps=4, num_stages=3)
    return SkinnyConfig(64, 128, default_split_k(n, k, 64, 128, sm_count), num_warps=4, num_stages=3)


@triton.jit(do_not_specialize=["M"])
def _skinny_gemm_kernel(
    x_ptr, w_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, split_k, tiles_per_split,
    stride_xm, stride_wn, stride_om, stride_on, stride_ps, stride_pm,
    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, USE_DOT: tl.constexpr, EVEN_K: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, M_PAD)
    offs_k = tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
    k_start = pid_k * tiles_per_split * BLOCK_K
    num_tiles = tl.minimum(tiles_per_split, tl.cdiv(K - k_start, BLOCK_K))
    # rows past N read row n % N (valid memory, no load mask) and are never stored
    w_rows = (offs_n % N).to(tl.int64) * stride_wn
    w_ptrs = w_ptr + w_rows[:, None] + (k_start + offs_k)[None, :]  # [BLOCK_N, BLOCK_K]
    m_ok = offs_m < M
    if USE_DOT:
        x_ptrs = x_ptr + offs_m[None, :] * stride_xm + (k_start + offs_k)[:, None]  # [BLOCK_K, M_PAD]
    else:
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k_start + offs_k)[None, :]  # [M_PAD, BLOCK_K]
    acc = tl.zeros((BLOCK_N, M_PAD), dtype=tl.float32)
    for t in range(num_tiles):
        if EVEN_K:
            w = tl.load(w_ptrs)
            if USE_DOT:
                x = tl.load(x_ptrs, mask=m_ok[None, :], other=0.0)
            else:
                x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        else:
            k_ok = k_start + t * BLOCK_K + offs_k < K
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
            if USE_DOT:
                x = tl.load(x_ptrs, mask=m_ok[None, :] & k_ok[:, None], other=0.0)
            else:
                x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT_FP32:  # the interpreter's bf16 dot is wrong; see _interpreted_bf16
            acc = tl.dot(w.to(tl.float32), x.to(tl.float32), acc, input_precision="ieee")
        elif USE_DOT:
            acc = tl.dot(w, x, acc)  # [BLOCK_N, BLOCK_K] @ [BLOCK_K, M_PAD]
        else:
            prod = w.to(tl.float32)[:, None, :] * x.to(tl.float32)[None, :, :]  # [BLOCK_N, M_PAD, BLOCK_K]
            acc += tl.sum(prod, axis=2)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    out_mask = (offs_n[:, None] < N) & m_ok[None, :]
    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None] * stride_on  # [BLOCK_N, M_PAD]
    if SPLIT:
        part_tile = offs_m[None, :] * stride_pm + offs_n[:, None]
        tl.store(part_ptr + pid_k * stride_ps + part_tile, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial is written before thread 0's release below
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        tl.debug_barrier()  # and the other splits' partials are read only after its acquire
        if arrived == split_k - 1:
            total = tl.load(part_ptr + part_tile, mask=out_mask, other=0.0, cache_modifier=".cg")
            for s in range(1, split_k):
                total += tl.load(part_ptr + s * stride_ps + part_tile, mask=out_mask, other=0.0,
                                 cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.store(count_ptr + pid_n, 0)  # ready for the next call, stream-ordered after this one
    else:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


def _interpreted_bf16(dtype: torch.dtype) -> bool:
    """Under TRITON_INTERPRET=1 (Triton 3.9) tl.dot multiplies bf16 operands' uint16 bit patterns
    (triton-lang/triton#11584, "not supported yet"), so there the dot's operands go in as fp32."""
    return dtype == torch.bfloat16 and type(_skinny_gemm_kernel).__name__ == "InterpretedFunction"


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return _DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check_inputs(x: torch.Tensor, weight: torch.Tensor) -> None:
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"x must be bfloat16 or float16, got {x.dtype}; cast it (x.to(torch.bfloat16))")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight must have x's dtype {x.dtype}, got {weight.dtype}")
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"x must be [M, K] with 1 <= M <= {MAX_ROWS}, got shape {list(x.shape)}; "
                         "use F.linear for more rows")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1] or weight.shape[0] < 1:
        raise ValueError(f"weight must be [N, K] with K = {x.shape[1]} (x's), got shape {list(weight.shape)}")
    for name, t in (("x", x), ("weight", weight)):
        if t.stride(1) != 1:
            raise ValueError(f"{name} must be row-major (stride 1 along K), got strides {t.stride()}; "
                             f"pass {name}.contiguous()")
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device} and x on {x.device}; they must share a device")


def _check_out(out: torch.Tensor, x: torch.Tensor, n: int) -> None:
    if out.shape != (x.shape[0], n) or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"out must be [{x.shape[0]}, {n}] {x.dtype} on {x.device}, got "
                         f"{list(out.shape)} {out.dtype} on {out.device}")


def _check_workspace(ws: SkinnyWorkspace, x: torch.Tensor, n: int, block_n: int, splits: int) -> None:
    row_blocks = triton.cdiv(n, block_n)
    if (ws.partials.device != x.device or ws.partials.shape[0] < splits or ws.partials.shape[2] < n
            or ws.counters.numel() < row_blocks):
        raise ValueError(f"workspace too small or elsewhere: this call needs partials >= [{splits}, {MAX_ROWS}, {n}] "
                         f"and >= {row_blocks} counters on {x.device}, got {list(ws.partials.shape)} and "
                         f"{ws.counters.numel()} on {ws.partials.device}; use SkinnyWorkspace.allocate({n}, "
                         f"max_split_k={splits}, device=...)")


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, *, config: SkinnyConfig | None = None,
                  out: torch.Tensor | None = None, workspace: SkinnyWorkspace | None = None) -> torch.Tensor:
    """x: [M, K] bf16/fp16, 1 <= M <= 32, row-major; weight: [N, K] same dtype (nn.Linear's layout).
    Returns out: [M, N] in x's dtype (fp32 accumulation), the given `out` when there is one.

    config: None picks `default_config(M, N, K, SM count)`. workspace: used only when the config splits
    K; None then allocates one for this call (an allocation and a memset of the counters, so pass one
    when capturing a CUDA graph: `SkinnyWorkspace.allocate(N, max_split_k=..., device=...)`)."""
    grid, args, meta = _launch_plan(x, weight, config, out, workspace)
    _skinny_gemm_kernel[grid](*args, **meta)
    return args[2]


def _launch_plan(x: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig | None, out: torch.Tensor | None,
                 workspace: SkinnyWorkspace | None) -> tuple[tuple[int, int], tuple, dict]:
    """(grid, arguments, constexprs and launch options) of one call, checked; meta tensors give the
    compile-only plan that `_skinny_gemm_kernel.warmup` takes."""
    _check_inputs(x, weight)
    (m, k), n = x.shape, weight.shape[0]
    config = config or default_config(m, n, k, _sm_count(x.device))
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    else:
        _check_out(out, x, n)
    k_tiles = triton.cdiv(k, config.block_k)
    tiles_per_split = triton.cdiv(k_tiles, config.split_k)
    splits = triton.cdiv(k_tiles, tiles_per_split)  # every launched split gets >= 1 tile
    if splits > 1:
        if workspace is None:
            workspace = SkinnyWorkspace.allocate(n, max_split_k=splits, device=x.device)
        _check_workspace(workspace, x, n, config.block_n, splits)
        part, count, part_strides = workspace.partials, workspace.counters, workspace.partials.stride()[:2]
    else:
        part, count, part_strides = out, out, (0, 0)  # never touched
    args = (x, weight, out, part, count, m, n, k, splits, tiles_per_split,
            x.stride(0), weight.stride(0), out.stride(0), out.stride(1), *part_strides)
    pad = triton.next_power_of_2(m)
    meta = dict(M_PAD=max(pad, MIN_DOT_ROWS) if config.use_dot else pad,
                BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT=splits > 1, USE_DOT=config.use_dot,
                EVEN_K=k % config.block_k == 0, DOT_FP32=config.use_dot and _interpreted_bf16(x.dtype),
                num_warps=config.num_warps, num_stages=config.num_stages)
    return (triton.cdiv(n, config.block_n), splits), args, meta
