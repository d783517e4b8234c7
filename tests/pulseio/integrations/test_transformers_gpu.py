"""The transformers caches on a GPU (CudaBackend: pinned host pool, copy engine, doorbell): the tokens of the
default cache, the device memory a cache claims against what the allocator handed out, and no host sync of
ours in a decode step. Skipped, saying so, without a GPU."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from hf_cache_models import greedy, owned_tensors, prompt_ids, tiny_model

from pulseio.integrations.transformers import SPARSE_ATTENTION, LayerOffloadCache, SparseOffloadCache, cache_kwargs

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model("qwen3", seed=3).to("cuda")


def _make(kind: str, model: Any, max_len: int) -> Any:
    if kind == "layer":
        model.set_attn_implementation("sdpa")
        return LayerOffloadCache(model, max_cache_len=max_len, tokens_per_unit=32)
    model.set_attn_implementation(SPARSE_ATTENTION)
    heads = None if kind == "quest" else [0, 1, 0, 1]
    return SparseOffloadCache(model, max_cache_len=max_len, budget_tokens=128, block_size=16, heads=heads)


@pytest.mark.parametrize("kind", ["layer", "quest", "solohead"])
def test_every_cache_generates_the_default_caches_tokens_on_the_gpu(model: Any, kind: str) -> None:
    ids = prompt_ids(100).cuda()
    expected = greedy(model, ids, 16)
    with _make(kind, model, 116) as cache:
        attention = "sdpa" if kind == "layer" else SPARSE_ATTENTION
        assert greedy(model, ids, 16, cache, attention=attention) == expected


@pytest.mark.parametrize("kind", ["layer", "quest", "solohead"])
def test_the_device_memory_a_cache_claims_is_what_the_allocator_handed_out(model: Any, kind: str) -> None:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with _make(kind, model, 4096) as cache:
        held = torch.cuda.memory_allocated() - before
        footprint = cache.memory_footprint()
        tensors = len(owned_tensors(cache)) - 1   # less the host pool
    # the caching allocator rounds each allocation up to 512 B; pulseio's own buffers are measured that way
    assert 0 <= held - footprint.device_bytes <= 512 * tensors, (held, footprint)


@pytest.mark.parametrize("kind", ["layer", "quest", "solohead"])
def test_a_decode_step_makes_no_host_sync_of_ours(model: Any, kind: str) -> None:
    """One decode forward under torch's sync debug mode: no synchronizing call from pulseio's integration
    (transformers' own code may sync elsewhere; no attention mask is passed, whose padding check would)."""
    ids = prompt_ids(300).cuda()
    with _make(kind, model, 320) as cache, torch.no_grad():
        logits = model(ids, use_cache=True, **cache_kwargs(model, cache)).logits
        token = logits[:, -1:].argmax(-1)
        for _ in range(2):   # the first decode step: first launches; the second: the sparse graphs' capture
            model(token, use_cache=True, **cache_kwargs(model, cache))
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                model(token, use_cache=True, **cache_kwargs(model, cache))
            finally:
                torch.cuda.set_sync_debug_mode("default")
        stats = cache.statistics()
    ours = [w for w in caught if "integrations" in str(w.filename)]
    assert not ours, [f"{w.filename}:{w.lineno}: {w.message}" for w in ours]
    if kind != "layer":
        assert stats.graph_failure is None and stats.graphed_halves == 2 * 2, stats  # 2 offloaded layers x 2
