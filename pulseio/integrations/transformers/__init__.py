"""pulseio under Hugging Face transformers: KV caches for `generate()` that keep the KV in a pulseio HostPool.

    from transformers import AutoModelForCausalLM
    from pulseio.integrations.transformers import LayerOffloadCache, SparseOffloadCache, SPARSE_ATTENTION

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda")
    with LayerOffloadCache(model, max_cache_len=ids.shape[1] + 256) as cache:   # whole layers, prefetched
        out = model.generate(ids, past_key_values=cache, max_new_tokens=256)

    model.set_attn_implementation(SPARSE_ATTENTION)       # or from_pretrained(..., attn_implementation=...)
    with SparseOffloadCache(model, max_cache_len=ids.shape[1] + 256, budget_tokens=2048) as cache:   # Quest
        out = model.generate(ids, past_key_values=cache, max_new_tokens=256)
    # heads=[h0, h1, ...]: SoloHead, one KV head per layer selects for all (e.g. `best` of a calibration file)

- `LayerOffloadCache` (layer_cache.py): every layer's KV in the pinned host pool; decode recalls layer
  l + P into a ring of P + 1 device buffers through a `DmaEngine` while layer l computes, in a few large
  copies; only the new tokens go back to the host.
- `SparseOffloadCache` (sparse_cache.py, sparse_step.py): the KV in block units in the host pool, a hot set
  of budget blocks per layer on the device; each decode step scores Quest digests with q, recalls the
  missing top-k blocks through `Runtime.post_recall` (ids decided on the device, no host sync) and attends
  to the selected blocks only, through the attention implementation registered here as SPARSE_ATTENTION.
  On a GPU a layer's decode work replays from two CUDA graphs from the second decode step on.
- `memory_footprint()` says what a cache holds on the device and in the host pool; `statistics()` what it
  moved (neither syncs); `reset()` readies a cache for another prompt; `close()` (or `with`) frees it.

transformers is imported here and only here (`import pulseio` does not import it). Tested with transformers
5.17.0 (the H200 image) and 5.24.0 (PyPI at the time of writing); other 5.x versions import with a warning,
4.x is refused. `past_key_values=` works in both (a deprecated alias of `cache=` in 5.24: `cache_kwargs`
picks the keyword the model takes). Greedy and sampled generation only: beam search and assisted decoding
(`reorder_cache`, `crop`) are refused by name. Models whose every layer is full attention (Llama, Qwen2,
Qwen3, ...); a batch of rows (left padding included) of one `batch_size` per cache.
"""

from __future__ import annotations

import warnings

import transformers

from .attention import register as _register
from .attention import sparse_attention_forward as sparse_attention_forward
from .cache_base import CacheCapacityError as CacheCapacityError
from .cache_base import CacheFootprint as CacheFootprint
from .cache_base import KVGeometry as KVGeometry
from .cache_base import cache_kwargs as cache_kwargs
from .layer_cache import LayerOffloadCache as LayerOffloadCache
from .layer_cache import LayerOffloadStatistics as LayerOffloadStatistics
from .selection import block_digests as block_digests
from .selection import block_scores as block_scores
from .selection import select_blocks as select_blocks
from .sparse_cache import SPARSE_ATTENTION as SPARSE_ATTENTION
from .sparse_cache import RecallError as RecallError
from .sparse_cache import SparseOffloadCache as SparseOffloadCache
from .sparse_cache import SparseOffloadStatistics as SparseOffloadStatistics
from .sparse_layout import SparseSelection as SparseSelection

TESTED_VERSIONS = ("5.17.0", "5.24.0")  # generate() with each cache, token for token against DynamicCache


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in version.split(".")[:2])
    return major, minor


if _major_minor(transformers.__version__) < (5, 0):
    raise ImportError(f"pulseio.integrations.transformers needs transformers >= 5 (its Cache layers API); found "
                      f"{transformers.__version__} (tested: {', '.join(TESTED_VERSIONS)})")
if not (5, 17) <= _major_minor(transformers.__version__) < (6, 0):
    warnings.warn(f"pulseio.integrations.transformers was tested with transformers {', '.join(TESTED_VERSIONS)}; "
                  f"this is {transformers.__version__}", stacklevel=2)

_register()  # attn_implementation=SPARSE_ATTENTION resolves from here on
