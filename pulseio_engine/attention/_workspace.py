"""`DecodeWorkspace`: the arrival counters of the split decode kernel, kept between calls.

With num_splits > 1 every program of one (sequence, KV head) adds 1 to that pair's int32 counter after
writing its partial output; the program that reads num_splits - 1 is the last, merges the partials into the
output and sets the counter back to 0. So every counter is 0 again when a launch ends, and a buffer zeroed
once serves every later launch, CUDA-graph replays included, with no memset in between.
"""

from __future__ import annotations

import torch


class DecodeWorkspace:
    """Arrival counters for `paged_decode_attention(..., workspace=...)`: one int32 per (sequence, KV head),
    zeroed here once and left at zero by every launch that runs to its end.

    Make one per owner of a decode batch's buffers and keep it (a captured graph holds its address); a call
    needs B * Hkv <= max_batch * num_kv_heads counters. Without one, each launch with splits zeroes a fresh
    buffer of its own: correct, one memset more.

    A workspace belongs to one stream: launches that may run at the same time (graphs replayed on two streams)
    must not share one, or their arrivals mix. A launch that does not finish (a device fault) leaves the
    counters undefined: make a new workspace after one.
    """

    def __init__(self, *, max_batch: int, num_kv_heads: int, device: torch.device | str) -> None:
        if max_batch < 1 or num_kv_heads < 1:
            raise ValueError(f"max_batch and num_kv_heads must be >= 1, got {max_batch} and {num_kv_heads}")
        self.max_batch = max_batch
        self.num_kv_heads = num_kv_heads
        self.counters = torch.zeros(max_batch * num_kv_heads, dtype=torch.int32, device=device)  # [max_batch * Hkv]
