"""What both pulseio caches share on the transformers side: a `transformers.Cache` whose layers only count
tokens (the KV itself lives in pulseio pools), the model's KV geometry, and the memory footprint.

transformers calls `Cache.update(key, value, layer_idx, ...)` once per attention layer and forward, in layer
order, with the layer's new post-RoPE keys and values [B, Hkv, T, D], and attends to what it returns; it
asks `get_seq_length()` and `get_mask_sizes()` for the tokens already cached. That is the whole contract a
cache must keep for `generate()` (5.17 through 5.24, where `past_key_values=` became `cache=`); beam search,
assisted decoding and cropping need more (`reorder_cache`, `crop`), which these caches refuse by name.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class CacheCapacityError(ValueError):
    """A forward would hold more tokens than the cache was built for (`max_cache_len`)."""


@dataclass(frozen=True)
class KVGeometry:
    """The KV cache shape of a decoder model (from its transformers config) and of one generate call."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    batch_size: int
    max_cache_len: int
    dtype: torch.dtype
    device: torch.device

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "batch_size", "max_cache_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")

    @classmethod
    def of(cls, model: Any, *, batch_size: int, max_cache_len: int) -> KVGeometry:
        """The geometry of a transformers decoder `model` whose every layer is full attention."""
        text = model.config.get_text_config(decoder=True)
        kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"} or getattr(text, "sliding_window", None) is not None:
            raise ValueError(f"the pulseio caches serve models whose every layer is full attention; this config has "
                             f"layer_types {sorted(kinds)} and sliding_window={getattr(text, 'sliding_window', None)}")
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        return cls(num_layers=text.num_hidden_layers, num_heads=heads,
                   num_kv_heads=getattr(text, "num_key_value_heads", None) or heads, head_dim=head_dim,
                   batch_size=batch_size, max_cache_len=max_cache_len, dtype=model.dtype, device=model.device)

    @property
    def elem_bytes(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def check_update(self, key: torch.Tensor, cached: int) -> None:
        """key: [B, Hkv, T, D], the new keys of a layer that holds `cached` tokens."""
        b, h, t, d = key.shape
        if (b, h, d) != (self.batch_size, self.num_kv_heads, self.head_dim) or key.dtype != self.dtype:
            raise ValueError(f"new keys of shape {tuple(key.shape)} and dtype {key.dtype}; the cache was built for "
                             f"[{self.batch_size}, {self.num_kv_heads}, T, {self.head_dim}] {self.dtype} "
                             "(batch_size= and the model's dtype)")
        if cached + t > self.max_cache_len:
            raise CacheCapacityError(f"{cached} cached + {t} new tokens exceed max_cache_len={self.max_cache_len}; "
                                     "build the cache with a larger max_cache_len (prompt + max_new_tokens)")


@dataclass(frozen=True)
class CacheFootprint:
    """Memory a cache holds. device_bytes: on the model's device, the sum of `parts`; host_bytes: the pinned
    host pool. `parts["pulseio"]` is what pulseio allocated on the device beside the pools (staging, rings,
    mirrors), measured as the allocator's growth while they were built (0 without a GPU)."""

    device_bytes: int
    host_bytes: int
    parts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, host_bytes: int, **parts: int) -> CacheFootprint:
        return cls(device_bytes=sum(parts.values()), host_bytes=host_bytes, parts=dict(parts))


class _CountingLayer(CacheLayerMixin):
    """A layer as transformers sees it: how many tokens it holds. The KV is the owning cache's."""

    is_compileable = False
    is_sliding = False

    def __init__(self) -> None:
        super().__init__()
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the owning pulseio cache updates its layers")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0
        self.is_initialized = False


class PulseioCache(Cache):
    """Base of the pulseio caches: the layers' token counts, lifecycle, and the refusals (see the module doc).
    Subclasses implement `update` and `memory_footprint`, and release their pools in `close`."""

    def __init__(self, geometry: KVGeometry) -> None:
        super().__init__(layers=[_CountingLayer() for _ in range(geometry.num_layers)])
        self.geometry = geometry
        self._closed = False

    def _counted(self, layer_idx: int) -> _CountingLayer:
        layer = self.layers[layer_idx]
        assert isinstance(layer, _CountingLayer)
        return layer

    def _advance(self, layer_idx: int, tokens: int) -> None:
        layer = self._counted(layer_idx)
        layer.length += tokens
        layer.is_initialized = True

    def memory_footprint(self) -> CacheFootprint:
        raise NotImplementedError

    def close(self) -> None:
        """Release the pools and pulseio's threads; the cache cannot be used after."""
        self._closed = True

    def __enter__(self) -> PulseioCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _refuse(self, what: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support {what} (greedy or sampled generate() "
                                  "only); use transformers' DynamicCache for it")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._refuse("beam search (reorder_cache)")

    def crop(self, tokens_to_remove: int) -> None:
        self._refuse("cropping (assisted decoding)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse("batch_repeat_interleave")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._refuse("batch_select_indices")


def device_allocated(device: torch.device) -> int:
    """Bytes torch's allocator holds for tensors on `device` (0 off CUDA)."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def allocated_beside(device: torch.device, before: int, pool_bytes: int) -> int:
    """What pulseio allocated on `device` since `before` (a `device_allocated` reading) beside its device pool
    of `pool_bytes`: its staging twins, rings and mirrors (0 off CUDA, where the pool is host memory)."""
    return device_allocated(device) - before - pool_bytes if device.type == "cuda" else 0


def cache_kwargs(model: Any, cache: Cache) -> dict[str, Cache]:
    """{keyword: cache} for `model.generate(**cache_kwargs(model, cache))`: `cache=` where the model's forward
    takes it (transformers 5.2x), `past_key_values=` before (5.17), which later versions still accept with a
    FutureWarning until 6.0."""
    return {"cache": cache} if "cache" in inspect.signature(model.forward).parameters else {"past_key_values": cache}
