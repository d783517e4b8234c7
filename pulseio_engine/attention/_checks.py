"""Argument checks shared by the reference and the Triton path: shapes, dtypes and devices.

Everything here reads only tensor metadata (shape, dtype, device, strides), never tensor values,
so the checks are free of host syncs and safe inside CUDA-graph capture.
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPE = torch.int32


def check_paged_decode_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    num_kv_heads: int | None = None,
) -> None:
    """Raise TypeError/ValueError naming the offending value and the rule it breaks."""
    for name, t in (
        ("q", q),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("block_tables", block_tables),
        ("context_lens", context_lens),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    _check_dims(q, k_cache, v_cache, block_tables, context_lens, num_kv_heads)
    _check_dtypes(q, k_cache, v_cache, block_tables, context_lens)
    _check_devices(q, k_cache, v_cache, block_tables, context_lens)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise TypeError(f"scale must be a Python float, got {type(scale).__name__}")
    if out is not None:
        _check_out(q, out)


def _check_dims(q, k_cache, v_cache, block_tables, context_lens, num_kv_heads) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be [B, Hq, D] (3 dims), got shape {tuple(q.shape)}")
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache must be [num_blocks, block_size, Hkv, D] (4 dims), got shape {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    batch, hq, head_dim = q.shape
    _, block_size, hkv, kv_dim = k_cache.shape
    if kv_dim != head_dim:
        raise ValueError(f"head_dim of q ({head_dim}) must equal head_dim of k_cache ({kv_dim})")
    heads = hkv if num_kv_heads is None else num_kv_heads
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or hq % heads != 0:
        raise ValueError(f"Hq ({hq}) must be a multiple of Hkv ({heads}) for grouped-query attention")
    if block_size < 1:
        raise ValueError(f"block_size (k_cache.shape[1]) must be >= 1, got {block_size}")
    if block_tables.dim() == 3:   # row tables: [B, S, M], row s serving KV heads [s * Hkv / S, (s + 1) * Hkv / S)
        rows = block_tables.shape[1]
        if block_tables.shape[0] != batch or rows < 1 or block_tables.shape[2] < 1 or heads % rows:
            raise ValueError(f"row block_tables must be [B={batch}, S, max_blocks>=1] with S dividing Hkv ({heads}), "
                             f"got shape {tuple(block_tables.shape)}")
        if hkv not in (heads, heads // rows):
            raise ValueError(f"k_cache must hold all {heads} KV heads or the {heads // rows} of one table row, "
                             f"got {hkv}")
        if tuple(context_lens.shape) != (batch, rows):
            raise ValueError(f"context_lens must be [B={batch}, S={rows}] with row tables, got shape "
                             f"{tuple(context_lens.shape)}")
        return
    if num_kv_heads not in (None, hkv):
        raise ValueError(f"num_kv_heads ({num_kv_heads}) must equal k_cache's heads ({hkv}) with [B, M] block_tables")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or block_tables.shape[1] < 1:
        raise ValueError(f"block_tables must be [B={batch}, max_blocks>=1], got shape {tuple(block_tables.shape)}")
    if context_lens.dim() != 1 or context_lens.shape[0] != batch:
        raise ValueError(f"context_lens must be [B={batch}], got shape {tuple(context_lens.shape)}")


def _check_dtypes(q, k_cache, v_cache, block_tables, context_lens) -> None:
    if q.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q.dtype must be one of float16/bfloat16/float32, got {q.dtype}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"k_cache/v_cache dtype ({k_cache.dtype}/{v_cache.dtype}) must equal q.dtype ({q.dtype})")
    if block_tables.dtype != INDEX_DTYPE:
        raise TypeError(f"block_tables.dtype must be torch.int32, got {block_tables.dtype}")
    if context_lens.dtype != INDEX_DTYPE:
        raise TypeError(f"context_lens.dtype must be torch.int32, got {context_lens.dtype}")


def _check_devices(q, k_cache, v_cache, block_tables, context_lens) -> None:
    for name, t in (
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("block_tables", block_tables),
        ("context_lens", context_lens),
    ):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all inputs must share q's device")


def _check_out(q: torch.Tensor, out: torch.Tensor) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.shape != q.shape:
        raise ValueError(f"out shape {tuple(out.shape)} must equal q shape {tuple(q.shape)}")
    if out.dtype != q.dtype:
        raise TypeError(f"out.dtype ({out.dtype}) must equal q.dtype ({q.dtype})")
    if out.device != q.device:
        raise ValueError(f"out is on {out.device} but q is on {q.device}")
