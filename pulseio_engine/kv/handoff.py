"""KV handed to the decode instance instead of a prompt to prefill (prefill/decode disaggregation).

A `KVSource` gives the first `num_tokens` tokens of one request's KV, one layer at a time, as whole
blocks in the paged cache's layout. `write_into` puts a source's layers into the blocks the scheduler
reserved; an offload request's offloaded layers go to the host pool instead (`Offloader.load_handoff`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .cache import KVCache


class KVSource(Protocol):
    @property
    def num_tokens(self) -> int: ...

    def layer_blocks(self, layer: int, cache: KVCache) -> torch.Tensor:
        """Layer `layer`'s KV as [ceil(num_tokens / bs), 2, bs, Hkv, D] blocks in the cache's dtype and
        device (K then V; positions past num_tokens are padding)."""
        ...


def write_into(source: KVSource, cache: KVCache, block_ids: torch.Tensor, layers: range | None = None) -> None:
    """Write `layers` (default: every layer the cache keeps) of `source` into blocks `block_ids`
    ([>= n_blocks] int64 on the cache's device)."""
    n_blocks = -(-source.num_tokens // cache.block_size)
    for layer in layers if layers is not None else range(cache.paged_layers):
        cache.kv[layer].index_copy_(0, block_ids[:n_blocks], source.layer_blocks(layer, cache))


@dataclass(frozen=True)
class KVHandoff:
    """KV computed elsewhere: `layers[l] = (k, v)`, each [num_tokens, Hkv, D], any device/dtype."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    def __post_init__(self) -> None:
        shapes = {tuple(t.shape) for pair in self.layers for t in pair}
        if not self.layers or len(shapes) != 1 or len(next(iter(shapes))) != 3:
            raise ValueError(f"KVHandoff needs one (k, v) pair per layer, all [n, Hkv, D]; got shapes {shapes}")

    @property
    def num_tokens(self) -> int:
        return self.layers[0][0].shape[0]

    def check(self, cache: KVCache) -> None:
        """Refuse a handoff of another model's shape, naming both."""
        if len(self.layers) != cache.num_layers:
            raise ValueError(f"KVHandoff has {len(self.layers)} layers, the model has {cache.num_layers}")
        shape = (cache.num_kv_heads, cache.head_dim)
        if tuple(self.layers[0][0].shape[1:]) != shape:
            raise ValueError(f"KVHandoff tensors are [n, {tuple(self.layers[0][0].shape[1:])}], "
                             f"the cache wants [n, Hkv, D] = [n, {shape}]")

    def layer_blocks(self, layer: int, cache: KVCache) -> torch.Tensor:
        self.check(cache)
        n, bs = self.num_tokens, cache.block_size
        kv = torch.stack(self.layers[layer]).to(cache.device, cache.dtype)        # [2, n, Hkv, D]
        kv = torch.nn.functional.pad(kv, (0, 0, 0, 0, 0, -n % bs))                  # [2, n_blocks * bs, Hkv, D]
        return kv.unflatten(1, (-1, bs)).transpose(0, 1)                            # [n_blocks, 2, bs, Hkv, D]


@dataclass(frozen=True)
class RandomKV:
    """Synthetic KV for benchmarks: N(0, std^2) values, whole blocks (so the tail past num_tokens is
    random too), drawn on the cache's device from a generator seeded per layer. Speed does not depend
    on KV values."""

    num_tokens: int
    std: float = 1.0
    seed: int = 0

    def layer_blocks(self, layer: int, cache: KVCache) -> torch.Tensor:
        n_blocks = -(-self.num_tokens // cache.block_size)
        gen = torch.Generator(device=cache.device).manual_seed(self.seed * 1_000_003 + layer)
        shape = (n_blocks, 2, cache.block_size, cache.num_kv_heads, cache.head_dim)
        return torch.randn(shape, generator=gen, device=cache.device, dtype=cache.dtype) * self.std
