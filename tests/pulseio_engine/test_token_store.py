"""`store_tokens`: the Triton kernel (under TRITON_INTERPRET=1, in a child process on CPU) against the
plain-torch path, bit for bit: K/V into paged-cache blocks, per-row units and hot slots, and the digests
of every head (Quest) or one head (SoloHead), with blocks started afresh (offset 0) and blocks extended."""

from __future__ import annotations

import json

import pytest
import torch
from interpreted import interpreted_results

from pulseio_engine.kv.digests import BlockDigests
from pulseio_engine.kv.token_store import store_tokens

# id -> (Hkv, heads per unit hg, digested heads: None = all, or the one head per layer, dtype)
CASES = {
    "paged-cache-quest-digests": (4, 4, None, "float32"),
    "paged-cache-solohead-digest": (4, 4, (2, 1), "float32"),
    "per-head-units-no-digest": (4, 1, "none", "float32"),
    "two-head-units-fp16": (4, 2, (0, 3), "float16"),
}


def _case(hkv: int, hg: int, heads, dtype: torch.dtype, seed: int = 0):  # noqa: ANN001, ANN202
    """Two layers' worth of state; a batch of 5 tokens in distinct units / blocks, two at offset 0."""
    gen = torch.Generator().manual_seed(seed)
    t, bs, d, n_units, n_blocks = 5, 4, 16, 24, 12
    pool = torch.randn((n_units, 2, bs, hg, d), generator=gen).to(dtype)
    units = torch.randperm(n_units, generator=gen)[: t * (hkv // hg)].view(t, hkv // hg)
    offsets = torch.tensor([0, 3, 1, 0, 2])
    k, v = (torch.randn((t, hkv, d), generator=gen).to(dtype) for _ in range(2))
    digests = None
    if heads != "none":
        digests = BlockDigests(num_layers=2, num_blocks=n_blocks, num_kv_heads=hkv, head_dim=d, block_size=bs,
                               dtype=dtype, device="cpu", heads=heads)
        digests.max.copy_(torch.randn(digests.max.shape, generator=gen))
        digests.min.copy_(digests.max - torch.rand(digests.max.shape, generator=gen))
    blocks = 1 + torch.randperm(n_blocks - 1, generator=gen)[:t]     # block 0 is the padding block
    return pool, units, offsets, k, v, digests, blocks


def _store(case, layer: int) -> list[torch.Tensor]:  # noqa: ANN001
    pool, units, offsets, k, v, digests, blocks = case
    store_tokens(pool, units, offsets, k, v, digests=digests, layer=layer,
                 digest_blocks=None if digests is None else blocks)
    return [pool] + ([] if digests is None else [digests.max[:, 1:], digests.min[:, 1:]])


def _main() -> None:
    from pulseio_engine.kv.store_kernel import launch_store_tokens

    results = {}
    for name, (hkv, hg, heads, dtype) in CASES.items():
        for layer in (0, 1):
            expect = _store(_case(hkv, hg, heads, getattr(torch, dtype)), layer)
            pool, units, offsets, k, v, digests, blocks = _case(hkv, hg, heads, getattr(torch, dtype))
            if layer == 1:     # offsets and blocks as column views of wider tensors: the kernel follows strides
                offsets = torch.stack([offsets, torch.full_like(offsets, 99)], dim=1)[:, 0]
                blocks = torch.stack([blocks, torch.zeros_like(blocks)], dim=1)[:, 0]
            digest = None
            if digests is not None:
                digest = (digests.max[layer], digests.min[layer], blocks,
                          -1 if digests.heads is None else digests.heads[layer])
            launch_store_tokens(pool, units, offsets, k, v, digest)
            got = [pool] + ([] if digests is None else [digests.max[:, 1:], digests.min[:, 1:]])   # 0: scratch
            results[f"{name}-layer{layer}"] = [bool(torch.equal(a, b)) for a, b in zip(got, expect, strict=True)]
    print(json.dumps(results))


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return interpreted_results(__file__)


@pytest.mark.needs_package("triton")
@pytest.mark.parametrize("name", [f"{n}-layer{layer}" for n in CASES for layer in (0, 1)])
def test_interpreted_kernel_stores_what_the_torch_path_stores(interpreted: dict, name: str) -> None:
    assert interpreted[name] and all(interpreted[name]), f"pool, digest max, digest min equal: {interpreted[name]}"


def test_torch_path_writes_the_units_and_digest_rules() -> None:
    """The reference itself: each token lands in its unit at its offset and nowhere else; a block at offset 0
    starts afresh, others fold in with max / min; only the SoloHead head is digested."""
    case = _case(4, 2, (0, 3), torch.float32)
    pool0, max0 = case[0].clone(), case[5].max.clone()
    pool, units, offsets, k, v, digests, blocks = case
    before_max, before_min = digests.max.clone(), digests.min.clone()
    store_tokens(pool, units, offsets, k, v, digests=digests, layer=1, digest_blocks=blocks)
    for t in range(5):
        for h in range(4):
            assert torch.equal(pool[units[t, h // 2], 0, offsets[t], h % 2], k[t, h])
            assert torch.equal(pool[units[t, h // 2], 1, offsets[t], h % 2], v[t, h])
        fresh = offsets[t] == 0
        want_max = k[t, 3] if fresh else torch.maximum(before_max[1, blocks[t], 0], k[t, 3])
        want_min = k[t, 3] if fresh else torch.minimum(before_min[1, blocks[t], 0], k[t, 3])
        assert torch.equal(digests.max[1, blocks[t], 0], want_max)
        assert torch.equal(digests.min[1, blocks[t], 0], want_min)
    touched = torch.zeros(pool.shape[:3], dtype=torch.bool)
    touched[units.reshape(-1), :, offsets.repeat_interleave(2)] = True
    assert torch.equal(pool[~touched], pool0[~touched])
    assert torch.equal(digests.max[0], before_max[0])          # layer 0 untouched
    assert not torch.equal(max0, digests.max)                  # the test is not vacuous


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_token_store_gpu(name: str) -> None:
    """The compiled kernel on CUDA against the torch path on the CPU, bit for bit, in bf16."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    hkv, hg, heads, _ = CASES[name]
    for layer in (0, 1):
        expect = _store(_case(hkv, hg, heads, torch.bfloat16), layer)
        pool, units, offsets, k, v, digests, blocks = _case(hkv, hg, heads, torch.bfloat16)
        cuda = [x.cuda() for x in (pool, units, offsets, k, v, blocks)]
        if digests is not None:
            digests.max, digests.min = digests.max.cuda(), digests.min.cuda()
        store_tokens(cuda[0], cuda[1], cuda[2], cuda[3], cuda[4], digests=digests, layer=layer,
                     digest_blocks=None if digests is None else cuda[5])
        got = [cuda[0]] + ([] if digests is None else [digests.max[:, 1:], digests.min[:, 1:]])
        assert all(torch.equal(a.cpu(), b) for a, b in zip(got, expect, strict=True)), (name, layer)


if __name__ == "__main__":
    _main()
