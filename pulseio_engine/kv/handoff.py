"""KV handed to the decode instance instead of a prompt to prefill (prefill/decode disaggregation).

A `KVSource` writes the first `num_tokens` tokens of one request's KV into the cache, into the
blocks the scheduler reserved for it, before the request's first decode step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .cache import KVCache


class KVSource(Protocol):
    @property
    def num_tokens(self) -> int: ...

    def write_into(self, cache: KVCache, block_ids: torch.Tensor) -> None:
        """block_ids: [n_blocks] int64 on the cache's device."""
        ...


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

    def write_into(self, cache: KVCache, block_ids: torch.Tensor) -> None:
        if len(self.layers) != cache.num_layers:
            raise ValueError(f"KVHandoff has {len(self.layers)} layers, the model has {cache.num_layers}")
        shape = (cache.num_kv_heads, cache.head_dim)
        if tuple(self.layers[0][0].shape[1:]) != shape:
            raise ValueError(f"KVHandoff tensors are [n, {tuple(self.layers[0][0].shape[1:])}], "
                             f"the cache wants [n, Hkv, D] = [n, {shape}]")
        for layer, (k, v) in enumerate(self.layers):
            cache.load_tokens(layer, block_ids, k, v)


@dataclass(frozen=True)
class RandomKV:
    """Synthetic KV for benchmarks: N(0, std^2) values written straight into the request's blocks
    (whole blocks, so the tail past num_tokens is random too). Speed does not depend on KV values."""

    num_tokens: int
    std: float = 1.0
    seed: int = 0

    def write_into(self, cache: KVCache, block_ids: torch.Tensor) -> None:
        n_blocks = -(-self.num_tokens // cache.block_size)
        ids = block_ids[:n_blocks]
        gen = torch.Generator(device=cache.device).manual_seed(self.seed)
        for layer in range(cache.num_layers):
            shape = (n_blocks,) + tuple(cache.kv[layer].shape[1:])
            values = torch.randn(shape, generator=gen, device=cache.device, dtype=cache.dtype) * self.std
            cache.kv[layer].index_copy_(0, ids, values)
