"""Launch configuration and grid of the Triton paged decode kernels.

`choose_config` picks the tile (BLOCK_N tokens, warps, pipeline stages) and the split count from
shapes only: B, Hkv, head_dim, page size, `max_blocks` and the SM count. Never from `context_lens`
values, so a captured CUDA graph stays valid for any lengths up to max_blocks * block_size.

Split count: with equal-length sequences every program does equal work, so the run is a whole number
of "waves" of resident programs and a last, partly filled wave idles SMs. We estimate how many programs
fit on an SM (shared-memory ring and registers), ask for at least _MIN_WAVES waves (so a wrong estimate
costs little), and among up to twice that many splits take the one whose last wave is fullest.

Short tables (at most _SHORT_TILES tiles: a sparse layer's selected blocks, a budget of 2048 tokens) are
a few microseconds of work, where each program's prologue and the reduce launch weigh: two pipeline
stages and about _SHORT_PROGRAMS_PER_SM programs an SM, except that two splits or fewer become one (no
reduce kernel). The sparse shapes of benchmarks/bench_attention.py measure these against the rule for long
contexts.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from . import _kernel

_TILE_BYTES = 16384  # bytes of one K (or V) tile per loop iteration: 64 tokens at D=128 in bf16
_NUM_WARPS = 4
_NUM_STAGES = 3
_DEFAULT_NUM_SMS = 132  # H200 / H100 SXM; used when the tensors are not on a CUDA device (interpreter)
_MIN_WAVES = 4
_SMEM_PER_SM = 228 * 1024  # sm_90
_REGS_PER_THREAD_EST = 128  # what the sm_90 builds of the default tiles use, give or take
_MIN_TILES_PER_SPLIT = 4  # below this the per-program prologue/epilogue stops being amortised
_MAX_SPLITS = 128
_SHORT_TILES = 32
_SHORT_PROGRAMS_PER_SM = 4


@dataclass(frozen=True)
class DecodeConfig:
    """One launch configuration; `num_splits == 1` skips the reduce kernel."""

    block_n: int  # tokens per loop iteration (power of two >= 16)
    num_warps: int
    num_stages: int
    num_splits: int
    prefetch: bool = False  # explicit register prefetch of the next tile instead of Triton's pipeliner

    def __post_init__(self) -> None:
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"block_n must be a power of two >= 16, got {self.block_n}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")
        if not 1 <= self.num_splits <= 1024:
            raise ValueError(f"num_splits must be in [1, 1024], got {self.num_splits}")


def choose_config(
    *,
    batch: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    max_blocks: int,
    num_sms: int,
    element_size: int = 2,
) -> DecodeConfig:
    """Heuristic tile and split count for one shape (see module docstring)."""
    block_n = max(16, _TILE_BYTES // (head_dim * element_size))
    num_warps = _NUM_WARPS if element_size <= 2 else 8  # fp32 dots run on FMAs: spread their registers
    per_sm = _resident_programs_per_sm(block_n, head_dim, element_size, num_warps, _NUM_STAGES)
    max_tiles = -(-max_blocks * page_size // block_n)
    cap = max(1, min(_MAX_SPLITS, max_tiles // _MIN_TILES_PER_SPLIT))
    pairs = batch * num_kv_heads
    if max_tiles <= _SHORT_TILES:
        splits = min(cap, round(_SHORT_PROGRAMS_PER_SM * num_sms / pairs))
        splits = 1 if splits <= 2 else splits
        return DecodeConfig(block_n=block_n, num_warps=num_warps, num_stages=2, num_splits=splits)
    splits = _choose_splits(pairs, per_sm * num_sms, cap)
    return DecodeConfig(block_n=block_n, num_warps=num_warps, num_stages=_NUM_STAGES, num_splits=splits)


def _resident_programs_per_sm(block_n: int, head_dim: int, element_size: int, num_warps: int,
                              num_stages: int) -> int:  # fmt: skip
    ring = 2 * block_n * head_dim * element_size * max(1, num_stages - 1)  # K and V buffers in flight
    by_smem = _SMEM_PER_SM // (ring + 8 * 1024)
    by_regs = 65536 // (num_warps * 32 * _REGS_PER_THREAD_EST)
    return max(1, min(by_smem, by_regs))


def _choose_splits(programs_per_split: int, slots: int, cap: int) -> int:
    """Splits giving >= _MIN_WAVES waves of `slots` resident programs, last wave as full as possible."""
    lo = min(cap, max(1, -(-_MIN_WAVES * slots // programs_per_split)))
    hi = min(cap, 2 * lo)

    def fullness(splits: int) -> float:
        waves = programs_per_split * splits / slots
        return waves / math.ceil(waves) - 1e-3 * splits  # ties go to fewer splits

    return max(range(lo, hi + 1), key=fullness)


@functools.lru_cache(maxsize=16)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return _DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def check_triton_shapes(q: torch.Tensor, k_cache: torch.Tensor) -> None:
    """Rules of the kernel beyond those of the API (see _checks)."""
    head_dim = q.shape[2]
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two in [16, 256] for the Triton kernel, got {head_dim}")


def paged_decode_attention_triton(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, C, D]: C = Hkv, or Hkv / S with row tables
    v_cache: torch.Tensor,  # [num_blocks, block_size, C, D]
    block_tables: torch.Tensor,  # [B, max_blocks] or row tables [B, S, max_blocks], int32
    context_lens: torch.Tensor,  # [B] (or [B, S]) int32
    scale: float,
    *,
    out: torch.Tensor | None = None,  # [B, Hq, D], q.dtype
    config: DecodeConfig | None = None,
    num_kv_heads: int | None = None,  # Hkv; default C
) -> torch.Tensor:  # [B, Hq, D], q.dtype
    """Launch the split kernel (and the reduce kernel when num_splits > 1); arguments pre-checked."""
    check_triton_shapes(q, k_cache)
    config = config or config_for(q, k_cache, block_tables.shape[-1], num_kv_heads)
    if out is None:
        out = torch.empty_like(q)
    if q.shape[0] == 0:
        return out
    if config.num_splits == 1:
        launch_split(q, k_cache, v_cache, block_tables, context_lens, scale, out, None, config, num_kv_heads)
        return out
    batch, hq, head_dim = q.shape
    part = torch.empty((batch, hq, config.num_splits, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.empty((batch, hq, config.num_splits), dtype=torch.float32, device=q.device)
    launch_split(q, k_cache, v_cache, block_tables, context_lens, scale, part, lse, config, num_kv_heads)
    launch_reduce(part, lse, out)
    return out


def config_for(q: torch.Tensor, k_cache: torch.Tensor, max_blocks: int, num_kv_heads: int | None) -> DecodeConfig:
    """`choose_config` for queries like q over pages like k_cache's, tables `max_blocks` wide."""
    return choose_config(batch=q.shape[0], num_kv_heads=num_kv_heads or k_cache.shape[2], head_dim=q.shape[2],
                         page_size=k_cache.shape[1], max_blocks=max_blocks, num_sms=_num_sms(q.device),
                         element_size=q.element_size())


def launch_split(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, scale: float, part: torch.Tensor, lse: torch.Tensor | None,
                 config: DecodeConfig, num_kv_heads: int | None,
                 prior: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """The split kernel over config.num_splits splits: lse None writes the output itself into `part` ([B, Hq, D],
    q.dtype: one split only); else each split's normalised output into part [B, Hq, >= splits, D] fp32 and its
    log-sum-exp (base 2) into lse [B, Hq, >= splits] fp32, contiguous along the splits. `prior` (with lse None):
    earlier tables' partial outputs [B, Hq, P, D] fp32 and log-sum-exps [B, Hq, P] (contiguous along P), merged
    into the output."""
    batch, hq, head_dim = q.shape
    _, page_size, cache_heads, _ = k_cache.shape
    hkv = num_kv_heads or cache_heads
    rows = block_tables.shape[1] if block_tables.dim() == 3 else 1
    max_blocks = block_tables.shape[-1]
    table_strides = (block_tables.stride(0), block_tables.stride(1) if rows > 1 else 0, block_tables.stride(-1))
    lens_strides = (context_lens.stride(0), context_lens.stride(1) if context_lens.dim() == 2 else 0)
    direct = lse is None
    part_strides: tuple[int, ...]
    lse_strides: tuple[int, ...]
    if direct:
        assert config.num_splits == 1, "the split kernel writes the output itself only with one split"
        part_strides = (part.stride(0), part.stride(1), 0, part.stride(2))
        lse_strides = (0, 0)
    else:
        assert lse is not None and lse.stride(2) == 1, "lse must be contiguous along the splits"
        part_strides = part.stride()
        lse_strides = lse.stride()[:2]
    if prior is None:
        prior_part, prior_lse, prior_count = part, part, 0
        prior_strides: tuple[int, ...] = (0,) * 5
    else:
        assert direct, "earlier tables merge into the output only with one split"
        prior_part, prior_lse = prior
        assert prior_part.stride(3) == 1 and prior_lse.stride(2) == 1, "prior partials must be contiguous"
        prior_count = prior_part.shape[2]
        prior_strides = (*prior_part.stride()[:3], *prior_lse.stride()[:2])
    _kernel._paged_decode_split_kernel[(hkv, config.num_splits, batch)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        part,
        part if direct else lse,
        float(scale) * 1.4426950408889634,
        config.num_splits,
        max_blocks * page_size,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *table_strides,
        *lens_strides,
        *part_strides,
        *lse_strides,
        prior_part,
        prior_lse,
        *prior_strides,
        GROUP=hq // hkv,
        GROUP_PAD=max(16, _next_pow2(hq // hkv)),
        HEAD_DIM=head_dim,
        PAGE_SIZE=page_size,
        BLOCK_N=config.block_n,
        DIRECT=direct,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        PREFETCH=config.prefetch,
        HEADS_PER_ROW=hkv // rows,
        CACHE_HEADS=cache_heads,
        PRIOR=prior_count,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


def launch_reduce(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> None:
    """Merge part [B, Hq, P, D] fp32 by lse [B, Hq, P] (base 2; at least one finite a head) into out [B, Hq, D]."""
    batch, hq, splits, head_dim = part.shape
    splits_pad = max(2, _next_pow2(splits))
    _kernel._reduce_splits_kernel[(hq, batch)](
        part,
        lse,
        out,
        splits,
        *part.stride()[:3],
        *lse.stride()[:2],
        *out.stride(),
        SPLITS_PAD=splits_pad,
        HEAD_DIM=head_dim,
        num_warps=4 if splits_pad * head_dim <= 4096 else 8,
    )
