"""The plain-torch reference and the CPU dispatch path of paged decode attention."""

from __future__ import annotations

import re

import pytest
import torch

from pulseio_engine.attention import (
    attend_last_part,
    attend_part,
    decode_partials,
    paged_decode_attention,
    paged_decode_attention_reference,
)
from pulseio_engine.attention.testing import dense_attention, random_paged_case, random_row_case, split_rows

SHAPES = [  # (Hq, Hkv, D): MHA, SmolLM2 (group 3), Qwen3-like (group 5) with D=128
    (4, 4, 64),
    (9, 3, 64),
    (10, 2, 128),
]
LENS = [1, 15, 16, 17, 100, 257]


def _run(case, fn=paged_decode_attention_reference):
    return fn(case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)


@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("hq,hkv,head_dim", SHAPES)
def test_reference_matches_dense_attention_fp32(hq, hkv, head_dim, block_size):
    case = random_paged_case(
        context_lens=LENS,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=head_dim,
        block_size=block_size,
        max_blocks=300 // block_size + 2,
        seed=hq + block_size,
    )
    out = _run(case)
    assert out.dtype == torch.float32 and out.shape == case.q.shape
    torch.testing.assert_close(out.double(), dense_attention(case), rtol=1e-5, atol=1e-5)


def test_reference_sharp_softmax_is_stable():
    case = random_paged_case(context_lens=[3, 200], num_q_heads=6, num_kv_heads=2, head_dim=64, q_scale=40.0)
    out = _run(case)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), dense_attention(case), rtol=1e-4, atol=1e-4)


def test_reference_bf16_close_to_dense_and_returns_bf16():
    case = random_paged_case(
        context_lens=[5, 90], num_q_heads=9, num_kv_heads=3, head_dim=64, dtype=torch.bfloat16
    )
    out = _run(case)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), dense_attention(case), rtol=2e-2, atol=2e-2)


def test_length_one_returns_the_single_value_row():
    case = random_paged_case(context_lens=[1, 1], num_q_heads=4, num_kv_heads=2, head_dim=64)
    out = _run(case)  # softmax over one token is 1: the output is that token's V, for every q head
    expect = torch.stack([v[0].repeat_interleave(2, dim=0) for v in case.dense_v])
    torch.testing.assert_close(out, expect)


def test_dispatcher_on_cpu_writes_out_and_matches_reference():
    case = random_paged_case(context_lens=[7, 33, 64], num_q_heads=10, num_kv_heads=2, head_dim=128)
    out = torch.full_like(case.q, float("nan"))
    ret = paged_decode_attention(
        case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale, out=out
    )
    assert ret is out
    torch.testing.assert_close(out, _run(case))


def _args():
    case = random_paged_case(context_lens=[4, 9], num_q_heads=4, num_kv_heads=2, head_dim=64)
    return dict(
        q=case.q,
        k_cache=case.k_cache,
        v_cache=case.v_cache,
        block_tables=case.block_tables,
        context_lens=case.context_lens,
        scale=case.scale,
    )


@pytest.mark.parametrize(
    "change,error,message",
    [
        (lambda a: a.update(q=a["q"][0]), ValueError, "q must be [B, Hq, D] (3 dims), got shape (4, 64)"),
        (
            lambda a: a.update(q=a["q"][:, :3]),
            ValueError,
            "Hq (3) must be a multiple of Hkv (2) for grouped-query attention",
        ),
        (lambda a: a.update(v_cache=a["v_cache"][:-1]), ValueError, "v_cache shape"),
        (
            lambda a: a.update(block_tables=a["block_tables"].long()),
            TypeError,
            "block_tables.dtype must be torch.int32, got torch.int64",
        ),
        (
            lambda a: a.update(context_lens=a["context_lens"][:1]),
            ValueError,
            "context_lens must be [B=2], got shape (1,)",
        ),
        (
            lambda a: a.update(k_cache=a["k_cache"].half(), v_cache=a["v_cache"].half()),
            TypeError,
            "k_cache/v_cache dtype (torch.float16/torch.float16) must equal q.dtype (torch.float32)",
        ),
        (lambda a: a.update(q=a["q"].int()), TypeError, "q.dtype must be one of float16/bfloat16/float32"),
        (lambda a: a.update(scale="0.1"), TypeError, "scale must be a Python float, got str"),
        (
            lambda a: a.update(out=torch.empty(2, 4, 32)),
            ValueError,
            "out shape (2, 4, 32) must equal q shape",
        ),
        (lambda a: a.update(out=torch.empty(2, 4, 64, dtype=torch.float16)), TypeError, "out.dtype"),
        (
            lambda a: a.update(q=a["q"][:, :, :32]),
            ValueError,
            "head_dim of q (32) must equal head_dim of k_cache",
        ),
    ],
)
def test_invalid_arguments_raise_with_the_rule(change, error, message):
    args = _args()
    change(args)
    with pytest.raises(error, match="^" + re.escape(message)):
        paged_decode_attention(**args)


@pytest.mark.parametrize("rows,pooled", [(1, False), (3, False), (3, True), (1, True)])
def test_row_tables_read_each_rows_selected_pages_only(rows, pooled):
    """Sparse attention: every (sequence, row) attends to its own subset of pages with its KV heads; the
    cache is either the paged one (all heads) or per-row units. Unselected pages are NaN-poisoned."""
    from pulseio_engine.attention.testing import random_row_case

    base = random_paged_case(context_lens=[1, 17, 64, 150], num_q_heads=6, num_kv_heads=3, head_dim=32)
    case = random_row_case(base, rows=rows, pooled=pooled)
    got = paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens,
                                 case.scale, num_kv_heads=case.num_kv_heads)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), case.expect, rtol=1e-5, atol=1e-5)


def test_row_tables_refuse_a_cache_of_neither_width():
    from pulseio_engine.attention.testing import random_row_case

    base = random_paged_case(context_lens=[5, 40], num_q_heads=8, num_kv_heads=4, head_dim=32)
    case = random_row_case(base, rows=2, pooled=True)       # units of 2 heads
    with pytest.raises(ValueError, match=re.escape("k_cache must hold all 8 KV heads or the 4 of one table row")):
        paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens,
                               case.scale, num_kv_heads=8)
    with pytest.raises(ValueError, match=re.escape("context_lens must be [B=2, S=2] with row tables")):
        paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens[:, 0],
                               case.scale, num_kv_heads=4)


@pytest.mark.parametrize("first", [0.5, 1.0, 0.0], ids=["dealt", "all-first", "all-second"])
@pytest.mark.parametrize("rows,pooled", [(1, True), (4, True), (2, False)], ids=["solohead", "quest", "paged"])
def test_attention_in_two_parts_merges_to_the_whole(first: float, rows: int, pooled: bool) -> None:
    """A row's pages dealt into two tables (one may be empty), attended part by part and merged: the attention over
    all of them (what an offloaded layer computes from its resident and its recalled blocks)."""
    base = random_paged_case(context_lens=[1, 17, 64, 150], num_q_heads=8, num_kv_heads=4, head_dim=32,
                             max_blocks=11, seed=3)
    case = random_row_case(base, rows=rows, pooled=pooled)
    parts = split_rows(case, 16, first=first, seed=1)
    work = decode_partials(case.q, case.k_cache, case.block_tables.shape[2], 2, num_kv_heads=case.num_kv_heads)
    (first_tables, first_lens), (last_tables, last_lens) = parts
    attend_part(work, 0, case.q, case.k_cache, case.v_cache, first_tables, first_lens, case.scale,
                num_kv_heads=case.num_kv_heads)
    out = attend_last_part(work, case.q, case.k_cache, case.v_cache, last_tables, last_lens, case.scale,
                           torch.full_like(case.q, float("nan")), num_kv_heads=case.num_kv_heads)
    assert (out.double() - case.expect).abs().max() < 1e-5
    if first in (0.0, 1.0):
        empty = work.lse[:, :, 1 if first == 1.0 else 0]
        assert torch.isinf(empty).all() and (empty < 0).all(), "an empty part has no weight"
