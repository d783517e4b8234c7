"""A request's KV read out of the engine that holds it, so another engine can take the request over.

`ResidentKV` is a `KVSource` (the handoff interface): the target engine loads it as it loads KV handed in by a
prefill instance, while the source engine still holds the request; the source lets it go after. Paged layers
come from the source's cache; an offload engine's offloaded layers from its host pool, gathered on the
device through the pool's device view (pulseio's `HostPool.device_view`), stream-ordered after the writes.
Going the other way, the target's `Offloader.load_handoff` stores them into its host pool the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine import Engine
from ..kv.block_table import blocks_for
from ..kv.cache import KVCache
from ..request import Sequence


@dataclass(frozen=True)
class ResidentKV:
    """The first `num_tokens` tokens of `seq`'s KV as it lies in `engine` (see the module doc)."""

    engine: Engine
    seq: Sequence
    num_tokens: int

    def layer_blocks(self, layer: int, cache: KVCache) -> torch.Tensor:
        """-> [ceil(num_tokens / bs), 2, bs, Hkv, D] in `cache`'s dtype and device (K then V)."""
        src, bs = self.engine, cache.block_size
        n = blocks_for(self.num_tokens, bs)
        off = src.offloader
        if off is not None and off.store is not None and layer >= off.dense:       # in the host pool
            k, v = off.store.read(off.seqs[self.seq.request_id], layer - off.dense, self.num_tokens)  # type: ignore[arg-type]
            kv = torch.nn.functional.pad(torch.stack([k, v]), (0, 0, 0, 0, 0, n * bs - self.num_tokens))
            blocks = kv.unflatten(1, (n, bs)).transpose(0, 1)                      # [n, 2, bs, Hkv, D]
        else:
            blocks = src.kv.kv[layer][src.runner.block_ids(self.seq, n)]
        return blocks.to(cache.device, cache.dtype)

    def host_bytes(self) -> int:
        """Bytes this request's offloaded layers hold in a host pool (0 when the source keeps none)."""
        off = self.engine.offloader
        if off is None or off.store is None:
            return 0
        return off.store.units_for(self.num_tokens) * off.layout.unit_bytes
