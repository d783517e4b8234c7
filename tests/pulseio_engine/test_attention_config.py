"""The launch heuristic: a function of shapes only, sized to fill the GPU."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.needs_package("triton")   # pulseio_engine.attention._launch imports the kernels


@pytest.fixture(scope="module")
def launch():  # noqa: ANN201 (the module)
    from pulseio_engine.attention import _launch

    return _launch


@pytest.mark.parametrize(
    "batch,hkv,head_dim,max_blocks",
    [
        (16, 8, 128, 2048),  # Qwen3-14B, 16 x 32K
        (64, 8, 128, 256),  # Qwen3-14B, 64 x 4K
        (64, 3, 64, 256),  # SmolLM2, 64 x 4K
        (1, 8, 128, 8192),  # one long sequence
    ],
)
def test_long_contexts_get_enough_programs_to_fill_the_sms(launch, batch, hkv, head_dim, max_blocks):
    config = launch.choose_config(
        batch=batch, num_kv_heads=hkv, head_dim=head_dim, page_size=16, max_blocks=max_blocks, num_sms=132
    )
    assert batch * hkv * config.num_splits >= 4 * 132
    tiles = max_blocks * 16 // config.block_n
    assert tiles // config.num_splits >= 4  # each split still streams several tiles


@pytest.mark.parametrize("hkv", [8, 2])
def test_short_tables_take_two_stages_and_fewer_splits_as_the_batch_grows(launch, hkv):
    """A sparse layer's table (128 pages of 16: 32 tiles of 64 tokens): about four programs an SM, never two
    splits (one is cheaper: no reduce kernel), never more splits than tiles allow."""
    splits = []
    for batch in (1, 2, 4, 8, 12, 16, 24, 32, 64, 128):
        config = launch.choose_config(batch=batch, num_kv_heads=hkv, head_dim=128, page_size=16, max_blocks=128,
                                      num_sms=132)
        assert config.num_stages == 2 and config.block_n == 64
        assert config.num_splits != 2 and 1 <= config.num_splits <= 32 // 4
        if config.num_splits > 2:
            assert abs(batch * hkv * config.num_splits - 4 * 132) <= batch * hkv or config.num_splits == 8
        splits.append(config.num_splits)
    assert splits == sorted(splits, reverse=True) and splits[-1] == 1


def test_short_contexts_are_not_split_into_empty_programs(launch):
    config = launch.choose_config(batch=1, num_kv_heads=8, head_dim=128, page_size=16, max_blocks=4, num_sms=132)
    assert config.num_splits == 1


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            dict(block_n=24, num_warps=4, num_stages=2, num_splits=1),
            "block_n must be a power of two >= 16, got 24",
        ),
        (dict(block_n=64, num_warps=3, num_stages=2, num_splits=1), "num_warps must be one of"),
        (dict(block_n=64, num_warps=4, num_stages=0, num_splits=1), "num_stages must be >= 1, got 0"),
        (dict(block_n=64, num_warps=4, num_stages=2, num_splits=0), "num_splits must be in [1, 1024], got 0"),
    ],
)
def test_config_validates(launch, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        launch.DecodeConfig(**kwargs)


def test_kernel_rejects_head_dims_it_cannot_tile():
    import torch

    from pulseio_engine.attention._launch import paged_decode_attention_triton

    q = torch.zeros(1, 2, 48)
    kv = torch.zeros(4, 16, 2, 48)
    tables, lens = torch.zeros(1, 4, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^head_dim must be a power of two in \[16, 256\] .* got 48$"):
        paged_decode_attention_triton(q, kv, kv, tables, lens, 0.1)
