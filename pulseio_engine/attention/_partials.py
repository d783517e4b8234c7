"""Decode attention over several block tables of the same queries, one table at a time, merged by the last.

An offloaded layer attends to the blocks it keeps on the GPU and to those its recall is bringing. With the
two in separate tables, the first part runs while the recall is still in flight and only the second waits
for it: `attend_part(partials, 0, ...)` before the device wait, `attend_last_part(partials, ...)` after it.
Each earlier part is split-K partial outputs with their log-sum-exps; the last part runs its table in one
split a (KV head, sequence) and merges every earlier split into the output in its epilogue (the ordinary
reduce of flash-decoding, with no launch of its own: the last part waits on the recall, so a launch there
is on the step's critical path). A row whose whole selection is recalled (a cold hot set) then streams its
table in one program a KV head, slower than in splits, on a step its recall outlasts anyway. A table's context
lengths may be 0 (a part with nothing in it), as long as every row has some token in some part.

The workspace has a fixed shape (`decode_partials`), so every call is CUDA-graph safe on CUDA tensors. On the
CPU each part is the plain-torch reference (one split a part).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ._checks import check_paged_decode_args
from ._reference import attention_with_lse_reference

if TYPE_CHECKING:
    from ._launch import DecodeConfig  # Triton's path only: a CPU install has no Triton


@dataclass(frozen=True)
class DecodePartials:
    """The workspace of a multi-table decode attention: each part's splits' outputs and log-sum-exps."""

    part: torch.Tensor  # [B, Hq, parts * splits, D] fp32
    lse: torch.Tensor   # [B, Hq, parts * splits] fp32, base 2 (-inf: a split with no token)
    splits: int         # splits of each part
    config: DecodeConfig | None  # the Triton launch configuration (None: the reference, on a CPU)


def decode_partials(q: torch.Tensor, k_cache: torch.Tensor, max_blocks: int, parts: int, *,
                    num_kv_heads: int | None = None, use_triton: bool | None = None) -> DecodePartials:
    """The workspace for `parts` tables of up to `max_blocks` pages each, for queries shaped like q [B, Hq, D]
    over pages shaped like k_cache's; its calls run the Triton kernels on CUDA tensors (`use_triton=True`
    forces them, for the interpreter's tests), the reference elsewhere."""
    if parts < 1 or max_blocks < 1:
        raise ValueError(f"parts and max_blocks must be >= 1, got {parts} and {max_blocks}")
    config = None
    splits = 1
    if q.is_cuda if use_triton is None else use_triton:
        from ._launch import check_triton_shapes, config_for

        check_triton_shapes(q, k_cache)
        config = config_for(q, k_cache, max_blocks, num_kv_heads)
        splits = config.num_splits
    batch, hq, head_dim = q.shape
    part = torch.zeros((batch, hq, parts * splits, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.full((batch, hq, parts * splits), float("-inf"), dtype=torch.float32, device=q.device)
    return DecodePartials(part, lse, splits, config)


def attend_part(partials: DecodePartials, index: int, q: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float, *,
                num_kv_heads: int | None = None) -> None:
    """Part `index` of the attention: q over block_tables' pages, as `paged_decode_attention` takes them but for
    context_lens, which may be 0. block_tables' width must not exceed the workspace's max_blocks."""
    check_paged_decode_args(q, k_cache, v_cache, block_tables, context_lens, scale, num_kv_heads=num_kv_heads)
    parts = partials.part.shape[2] // partials.splits
    if not 0 <= index < parts:
        raise ValueError(f"part {index} is not one of the workspace's {parts}")
    at = slice(index * partials.splits, (index + 1) * partials.splits)
    if partials.config is None:
        out, lse = attention_with_lse_reference(q, k_cache, v_cache, block_tables, context_lens, scale,
                                                num_kv_heads=num_kv_heads)
        partials.part[:, :, at.start] = out
        partials.lse[:, :, at.start] = lse
        return
    from ._launch import launch_split

    launch_split(q, k_cache, v_cache, block_tables, context_lens, scale, partials.part[:, :, at],
                 partials.lse[:, :, at], partials.config, num_kv_heads)


def attend_last_part(partials: DecodePartials, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float, out: torch.Tensor, *,
                     num_kv_heads: int | None = None) -> torch.Tensor:
    """The workspace's last part (as `attend_part` takes it) merged with every earlier part into out [B, Hq, D]
    (its dtype), in one launch on CUDA tensors; returns out."""
    parts = partials.part.shape[2] // partials.splits
    if partials.config is None:
        attend_part(partials, parts - 1, q, k_cache, v_cache, block_tables, context_lens, scale,
                    num_kv_heads=num_kv_heads)
        weight = torch.exp2(partials.lse - partials.lse.amax(dim=2, keepdim=True))     # [B, Hq, P]
        merged = (partials.part * weight[..., None]).sum(2) / weight.sum(2)[..., None]
        return out.copy_(merged)
    check_paged_decode_args(q, k_cache, v_cache, block_tables, context_lens, scale, num_kv_heads=num_kv_heads)
    from ._launch import DecodeConfig, launch_split

    earlier = slice(0, (parts - 1) * partials.splits)
    one = DecodeConfig(block_n=partials.config.block_n, num_warps=partials.config.num_warps,
                       num_stages=partials.config.num_stages, num_splits=1)
    launch_split(q, k_cache, v_cache, block_tables, context_lens, scale, out, None, one, num_kv_heads,
                 prior=(partials.part[:, :, earlier], partials.lse[:, :, earlier]))
    return out
