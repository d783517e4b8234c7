"""pulseio's transformers caches on tiny random models built by transformers (CPU, HostBackend): greedy
`generate()` gives the tokens of transformers' default cache wherever the cache holds the whole context,
the sparse cache with a small budget gives those of a plain-torch reference of the same selection, and the
memory a cache claims is the memory its tensors hold."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hf_cache_models import greedy, owned_tensors, prompt_ids, tiny_model
from hf_sparse_reference import register_reference
from torch.utils._python_dispatch import TorchDispatchMode

from pulseio.integrations.transformers import (
    SPARSE_ATTENTION,
    CacheCapacityError,
    LayerOffloadCache,
    SparseOffloadCache,
    SparseSelection,
    cache_kwargs,
)

ARCHS = ["qwen3", "qwen2", "llama"]
PROMPT, NEW = 70, 16


@pytest.fixture(scope="module", params=ARCHS)
def model(request: pytest.FixtureRequest) -> Any:
    return tiny_model(request.param)


@pytest.fixture(scope="module")
def qwen3() -> Any:
    return tiny_model("qwen3", seed=3)


@pytest.mark.parametrize("prefetch", [1, 2, 3])
def test_layer_offload_generates_the_tokens_of_the_default_cache(model: Any, prefetch: int) -> None:
    ids = prompt_ids(PROMPT)
    expected = greedy(model, ids, NEW)
    with LayerOffloadCache(model, max_cache_len=PROMPT + NEW, prefetch_layers=prefetch, tokens_per_unit=32) as cache:
        assert greedy(model, ids, NEW, cache) == expected
        stats = cache.statistics()
    layers = model.config.num_hidden_layers
    assert stats.recalls == layers * (NEW - 1) + min(prefetch, layers - 1), "one recall per layer and decode step"
    assert stats.bytes_recalled > 0


@pytest.mark.parametrize("heads", [None, "solohead"], ids=["quest", "solohead"])
def test_sparse_offload_with_a_covering_budget_generates_the_tokens_of_the_default_cache(model: Any,
                                                                                         heads: Any) -> None:
    ids = prompt_ids(PROMPT)
    expected = greedy(model, ids, NEW)
    layers = model.config.num_hidden_layers
    heads = None if heads is None else [layer % 2 for layer in range(layers)]
    model.set_attn_implementation(SPARSE_ATTENTION)
    with SparseOffloadCache(model, max_cache_len=PROMPT + NEW, budget_tokens=96, block_size=16, heads=heads,
                            dense_layers=1) as cache:
        assert greedy(model, ids, NEW, cache, attention=SPARSE_ATTENTION) == expected
        stats = cache.statistics()
    assert stats.recalls == (layers - 1) * (NEW - 1), "one doorbell request per offloaded layer and decode step"


@pytest.mark.parametrize("heads", [None, [1, 0, 1, 1]], ids=["quest", "solohead"])
@pytest.mark.parametrize("dense", [0, 2])
def test_sparse_offload_with_a_small_budget_matches_the_plain_torch_reference(qwen3: Any, heads: Any,
                                                                              dense: int) -> None:
    """96 prompt tokens in blocks of 8 (12 blocks, 14 by the end) against a budget of 4 blocks: most blocks are
    left out every step, and the selection moves as the queries do."""
    ids, n = prompt_ids(96, seed=5), 16
    selection = SparseSelection(budget_tokens=32, block_size=8, sink_blocks=1, local_blocks=1, dense_layers=dense,
                                heads=None if heads is None else tuple(heads))
    reference = register_reference(selection)
    expected, expected_logits = greedy(qwen3, ids, n, attention=reference, scores=True)
    full = greedy(qwen3, ids, n)
    qwen3.set_attn_implementation(SPARSE_ATTENTION)
    with SparseOffloadCache(qwen3, max_cache_len=96 + n, budget_tokens=32, block_size=8, sink_blocks=1,
                            local_blocks=1, dense_layers=dense, heads=heads) as cache:
        tokens, logits = greedy(qwen3, ids, n, cache, attention=SPARSE_ATTENTION, scores=True)
        stats = cache.statistics()
    assert tokens == expected
    torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-4)
    assert tokens != full, "the budget should change the output, or this test checks nothing sparse"
    first_step = (4 - dense) * (2 if heads is None else 1) * 4 * stats.unit_bytes   # rows x 4 blocks a layer
    assert stats.bytes_recalled > first_step, "later steps recall too: the selection moves"


@pytest.mark.parametrize("kind", ["layer", "quest", "solohead"])
def test_the_memory_a_cache_claims_is_the_memory_its_tensors_hold(qwen3: Any, kind: str) -> None:
    ids = prompt_ids(40)
    if kind == "layer":
        cache: Any = LayerOffloadCache(qwen3, max_cache_len=48, tokens_per_unit=16)
    else:
        qwen3.set_attn_implementation(SPARSE_ATTENTION)
        cache = SparseOffloadCache(qwen3, max_cache_len=48, budget_tokens=32, block_size=8,
                                   heads=None if kind == "quest" else [0, 1, 0, 1])
    with cache:
        greedy(qwen3, ids, 4, cache, attention="sdpa" if kind == "layer" else SPARSE_ATTENTION)
        storages = owned_tensors(cache)
        host = cache.host_pool.blocks.untyped_storage().data_ptr()
        footprint = cache.memory_footprint()
    assert footprint.parts["pulseio"] == 0  # no GPU: the pools are pulseio's only buffers
    assert storages.pop(host) == footprint.host_bytes
    assert sum(storages.values()) == footprint.device_bytes
    assert footprint.device_bytes == sum(footprint.parts.values())


@pytest.mark.parametrize("kind", ["layer", "sparse"])
def test_a_later_forward_of_several_tokens_reads_the_earlier_ones_back(qwen3: Any, kind: str) -> None:
    """Prompt in two chunks (40 + 24 tokens), then decode: logits as with transformers' DynamicCache."""
    from transformers import DynamicCache

    ids = prompt_ids(64, seed=7)
    attention = "sdpa" if kind == "layer" else SPARSE_ATTENTION

    def run(cache: Any) -> torch.Tensor:
        qwen3.set_attn_implementation(attention)
        with torch.no_grad():
            qwen3(ids[:, :40], use_cache=True, **cache_kwargs(qwen3, cache))
            return qwen3(ids[:, 40:], use_cache=True, **cache_kwargs(qwen3, cache)).logits

    expected = run(DynamicCache())
    qwen3.set_attn_implementation(attention)
    cache = LayerOffloadCache(qwen3, max_cache_len=64) if kind == "layer" else \
        SparseOffloadCache(qwen3, max_cache_len=64, budget_tokens=64, block_size=8)
    with cache:
        torch.testing.assert_close(run(cache), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["layer", "sparse"])
def test_reset_lets_one_cache_serve_another_generate_call(qwen3: Any, kind: str) -> None:
    first, second = prompt_ids(50, seed=11), prompt_ids(30, seed=12)
    attention = "sdpa" if kind == "layer" else SPARSE_ATTENTION
    expected = [greedy(qwen3, ids, 8) for ids in (first, second)]
    qwen3.set_attn_implementation(attention)
    cache = LayerOffloadCache(qwen3, max_cache_len=60) if kind == "layer" else \
        SparseOffloadCache(qwen3, max_cache_len=60, budget_tokens=64, block_size=8)
    with cache:
        assert greedy(qwen3, first, 8, cache, attention=attention) == expected[0]
        cache.reset()
        assert cache.get_seq_length() == 0
        assert greedy(qwen3, second, 8, cache, attention=attention) == expected[1]


def test_a_batch_of_two_rows_decodes_each_as_alone(qwen3: Any) -> None:
    rows = torch.cat([prompt_ids(40, seed=21), prompt_ids(40, seed=22)])
    expected = [greedy(qwen3, rows[i:i + 1], 8) for i in range(2)]
    for attention, make in (("sdpa", lambda: LayerOffloadCache(qwen3, max_cache_len=48, batch_size=2)),
                            (SPARSE_ATTENTION, lambda: SparseOffloadCache(qwen3, max_cache_len=48, batch_size=2,
                                                                          budget_tokens=48, block_size=8))):
        qwen3.set_attn_implementation(attention)
        with make() as cache, torch.no_grad():
            out = qwen3.generate(rows, attention_mask=torch.ones_like(rows), max_new_tokens=8, min_new_tokens=8,
                                 do_sample=False, **cache_kwargs(qwen3, cache))
        assert out[:, 40:].tolist() == expected, attention


def test_a_left_padded_batch_decodes_as_with_the_default_cache(qwen3: Any) -> None:
    """Two prompts of 40 and 30 tokens, the second left-padded: the sparse cache picks the padding mask's
    columns at the selected positions."""
    ids, mask = torch.zeros(2, 40, dtype=torch.long), torch.zeros(2, 40, dtype=torch.long)
    ids[0], ids[1, 10:] = prompt_ids(40, seed=23)[0], prompt_ids(30, seed=24)[0]
    mask[0], mask[1, 10:] = 1, 1

    def run(cache: Any, attention: str) -> list[list[int]]:
        qwen3.set_attn_implementation(attention)
        kwargs = {} if cache is None else cache_kwargs(qwen3, cache)
        with torch.no_grad():
            out = qwen3.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                                 **kwargs)
        return out[:, 40:].tolist()

    expected = run(None, "sdpa")
    with LayerOffloadCache(qwen3, max_cache_len=48, batch_size=2) as cache:
        assert run(cache, "sdpa") == expected
    qwen3.set_attn_implementation(SPARSE_ATTENTION)
    with SparseOffloadCache(qwen3, max_cache_len=48, batch_size=2, budget_tokens=48, block_size=8) as cache:
        assert run(cache, SPARSE_ATTENTION) == expected


def test_the_sparse_cache_refuses_a_model_that_does_not_attend_through_it(qwen3: Any) -> None:
    qwen3.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match=r"^the model attends with 'sdpa'; SparseOffloadCache needs "
                                         r"attn_implementation='pulseio_sparse'"):
        SparseOffloadCache(qwen3, max_cache_len=64)


@pytest.mark.parametrize("bad, message", [
    (dict(heads=[0, 1]), r"^heads names 2 layers' SoloHead heads; the model has 4"),
    (dict(heads=[0, 1, 2, 0]), r"^heads holds \[2\], not KV heads in \[0, 2\)"),
    (dict(budget_tokens=20, block_size=16), r"^budget_tokens=20 must be a multiple of block_size=16"),
    (dict(budget_tokens=16, block_size=16), r"^budget_tokens=16 \(1 blocks\) must cover sink_blocks \+ local_blocks"),
    (dict(dense_layers=4), r"^dense_layers=4 must leave a layer to offload"),
])
def test_bad_sparse_options_are_refused_naming_the_rule(qwen3: Any, bad: dict[str, Any], message: str) -> None:
    qwen3.set_attn_implementation(SPARSE_ATTENTION)
    with pytest.raises(ValueError, match=message):
        SparseOffloadCache(qwen3, max_cache_len=64, **bad)


def test_a_forward_past_max_cache_len_is_refused_before_anything_is_written(qwen3: Any) -> None:
    with LayerOffloadCache(qwen3, max_cache_len=32) as cache:
        with pytest.raises(CacheCapacityError, match=r"^0 cached \+ 40 new tokens exceed max_cache_len=32; "):
            greedy(qwen3, prompt_ids(40), 2, cache)
        assert cache.get_seq_length() == 0


def test_beam_search_is_refused_by_name(qwen3: Any) -> None:
    ids = prompt_ids(20)
    qwen3.set_attn_implementation("sdpa")
    with LayerOffloadCache(qwen3, max_cache_len=40, batch_size=2) as cache, torch.no_grad():
        with pytest.raises(NotImplementedError, match="does not support"):
            qwen3.generate(ids, max_new_tokens=4, num_beams=2, do_sample=False, **cache_kwargs(qwen3, cache))


class _NoHostReads(TorchDispatchMode):
    """Fails on any op that reads a tensor's value on the host: on a GPU each is a device sync (and illegal
    while a CUDA graph is captured). On the CPU they are cheap, so this is how CI catches them."""

    HOST_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
                  torch.ops.aten.masked_select.default, torch.ops.aten.is_nonzero.default}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in self.HOST_READS:
            raise AssertionError(f"{func} reads a device value on the host")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["layer", "quest", "solohead"])
def test_a_decode_step_of_ours_reads_no_device_value_on_the_host(qwen3: Any, kind: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """update() and the sparse attention run under a dispatch mode that refuses item(), nonzero() and the like
    (a 0-dim integer tensor used as an index is one: torch reads it with item())."""
    ids = prompt_ids(96, seed=9)
    owner = LayerOffloadCache if kind == "layer" else SparseOffloadCache
    for name in ("update", "attend_selected") if kind != "layer" else ("update",):
        original = getattr(owner, name)

        def guarded(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if self.get_seq_length(0) < 96:          # the prompt may read what it likes
                return _original(self, *args, **kwargs)
            with _NoHostReads():
                return _original(self, *args, **kwargs)

        monkeypatch.setattr(owner, name, guarded)
    qwen3.set_attn_implementation("sdpa" if kind == "layer" else SPARSE_ATTENTION)
    cache = LayerOffloadCache(qwen3, max_cache_len=112) if kind == "layer" else SparseOffloadCache(
        qwen3, max_cache_len=112, budget_tokens=32, block_size=8, heads=None if kind == "quest" else [0, 1, 0, 1])
    with cache:
        assert len(greedy(qwen3, ids, 6, cache, attention="sdpa" if kind == "layer" else SPARSE_ATTENTION)) == 6
