"""The compiled Triton kernel on a CUDA device, against the reference (bf16 per-row relative error <= 1e-2).

Every case is built by `random_paged_case`: shuffled physical pages inside an engine-shaped
`kv: [num_blocks, 2, block_size, Hkv, D]` tensor (so k/v caches are strided views), NaN in every page
slot a correct kernel must not read, out-of-range ids in unused block-table entries, and NaN in `out`.
"""

from __future__ import annotations

import pytest
import torch

from pulseio_engine.attention import paged_decode_attention, paged_decode_attention_reference
from pulseio_engine.attention.testing import random_paged_case

pytestmark = pytest.mark.gpu

SHAPES = {"smollm2": (9, 3, 64), "qwen3-14b": (40, 8, 128), "llama3-8b": (32, 8, 128)}
LENS = [1, 15, 16, 17, 333, 1024, 4099]


def _case(name, lens, dtype=torch.bfloat16, **kwargs):
    hq, hkv, head_dim = SHAPES[name]
    return random_paged_case(
        context_lens=lens,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=head_dim,
        dtype=dtype,
        device="cuda",
        **kwargs,
    )


def _reference(case):
    return paged_decode_attention_reference(
        case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale
    )


def _assert_close(got, expect, tol=1e-2):
    assert got.dtype == expect.dtype and got.shape == expect.shape
    assert torch.isfinite(got).all(), "non-finite output: a masked slot, unused page or stale out was read"
    got, expect = got.float(), expect.float()
    row_err = (got - expect).norm(dim=-1) / expect.norm(dim=-1).clamp_min(1e-6)  # per (sequence, head)
    assert row_err.max().item() <= tol, f"max per-row relative error {row_err.max().item():.3e} > {tol}"


def _run(case, config=None, **kwargs):
    out = torch.full_like(case.q, float("nan"))
    if config is None:
        got = paged_decode_attention(
            case.q,
            case.k_cache,
            case.v_cache,
            case.block_tables,
            case.context_lens,
            case.scale,
            out=out,
            **kwargs,
        )
    else:
        from pulseio_engine.attention._launch import paged_decode_attention_triton

        got = paged_decode_attention_triton(
            case.q,
            case.k_cache,
            case.v_cache,
            case.block_tables,
            case.context_lens,
            case.scale,
            out=out,
            config=config,
        )
    assert got is out
    return got


@pytest.mark.parametrize(
    "name,block_size",
    [("smollm2", 16), ("smollm2", 64), ("qwen3-14b", 16), ("qwen3-14b", 32), ("llama3-8b", 64)],
)
def test_bf16_matches_reference(name, block_size):
    case = _case(name, LENS, block_size=block_size, max_blocks=8192 // block_size, seed=block_size)
    _assert_close(_run(case), _reference(case))


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 5e-3), (torch.float32, 1e-4)])
def test_other_dtypes_match_reference(dtype, tol):
    case = _case("qwen3-14b", [1, 77, 2000], dtype=dtype, max_blocks=200)
    _assert_close(_run(case), _reference(case), tol)


def test_sharp_softmax_and_long_context():
    case = _case("qwen3-14b", [32768, 20001], q_scale=6.0, seed=3)
    _assert_close(_run(case), _reference(case))


@pytest.mark.parametrize(
    "block_n,num_warps,num_stages,num_splits,prefetch",
    [(16, 4, 1, 1, False), (32, 4, 2, 3, False), (128, 8, 2, 200, False), (64, 4, 1, 16, True)],
)
def test_explicit_configs_match_reference(block_n, num_warps, num_stages, num_splits, prefetch):
    from pulseio_engine.attention._launch import DecodeConfig

    config = DecodeConfig(block_n, num_warps, num_stages, num_splits, prefetch)
    case = _case("qwen3-14b", LENS, max_blocks=300)
    _assert_close(_run(case, config), _reference(case))


def test_contiguous_caches_and_strided_q_out_tables_lens():
    case = _case("llama3-8b", [5, 300, 1500], max_blocks=100)
    b, hq, d = case.q.shape
    tables = torch.stack([case.block_tables, torch.full_like(case.block_tables, -5)], dim=2)[:, :, 0]
    lens = torch.stack([case.context_lens, torch.full_like(case.context_lens, 10**6)], dim=1)[:, 0]
    qkv = torch.randn(b, hq * d + 1024, dtype=case.q.dtype, device="cuda")  # q as a slice of a qkv output
    q = qkv[:, : hq * d].view(b, hq, d)
    q.copy_(case.q)
    out = torch.full((b, hq, 2 * d), float("nan"), dtype=q.dtype, device="cuda")[:, :, :d]
    got = paged_decode_attention(
        q,
        case.k_cache.contiguous(),
        case.v_cache.contiguous(),
        tables,
        lens,
        case.scale,
        out=out,
    )
    assert got is out
    _assert_close(got, _reference(case))


def test_no_host_sync():
    case = _case("qwen3-14b", [100, 4000], max_blocks=256)
    _run(case)  # compile first: compilation is allowed to sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = paged_decode_attention(
            case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _assert_close(got, _reference(case))


def test_cuda_graph_replay_follows_new_lengths_and_tables():
    first = _case("qwen3-14b", [17, 900, 3000, 1], max_blocks=256, seed=1)
    second = _case("qwen3-14b", [4096, 1, 64, 2500], max_blocks=256, seed=2, spare_blocks=0)
    kv = torch.full(
        (max(first.kv.shape[0], second.kv.shape[0]),) + first.kv.shape[1:],
        float("nan"),
        dtype=first.kv.dtype,
        device="cuda",
    )
    q, tables, lens = first.q.clone(), first.block_tables.clone(), first.context_lens.clone()
    kv[: first.kv.shape[0]] = first.kv
    out = torch.empty_like(q)
    run = lambda: paged_decode_attention(q, kv[:, 0], kv[:, 1], tables, lens, first.scale, out=out)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # warm up (compile) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    _assert_close(out.clone(), _reference(first))
    kv.fill_(float("nan"))
    kv[: second.kv.shape[0]] = second.kv
    q.copy_(second.q)
    tables.copy_(second.block_tables)
    lens.copy_(second.context_lens)
    out.fill_(float("nan"))
    graph.replay()
    _assert_close(out.clone(), _reference(second))


@pytest.mark.parametrize("rows,pooled", [(8, False), (8, True), (1, True), (1, False), (2, True)])
def test_row_tables_match_naive_attention_over_each_rows_selection(rows, pooled):
    """Sparse attention in one launch: Quest's per-head rows on the paged cache (8, False) and on 1-head hot
    units (8, True), SoloHead's one row on all-head hot units (1, True), in bf16 at the qwen3-14b shape."""
    from pulseio_engine.attention.testing import random_row_case

    base = _case("qwen3-14b", [17, 333, 1024, 4099])
    case = random_row_case(base, rows=rows, pooled=pooled)
    out = torch.full_like(case.q, float("nan"))
    got = paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens,
                                 case.scale, out=out, num_kv_heads=case.num_kv_heads)
    _assert_close(got, case.expect.to(got.dtype))


@pytest.mark.parametrize("first", [0.85, 1.0, 0.0], ids=["dealt", "all-first", "all-second"])
@pytest.mark.parametrize("rows,pooled", [(1, True), (8, True)], ids=["solohead-hot", "quest-hot"])
def test_two_parts_merged_match_naive_attention(first, rows, pooled):
    """An offloaded layer's attention in two parts (its resident blocks, then the recalled ones), merged, in bf16
    at the qwen3-14b shape and captured in a CUDA graph: naive attention over the whole selection."""
    from pulseio_engine.attention import attend_last_part, attend_part, decode_partials
    from pulseio_engine.attention.testing import random_row_case, split_rows

    base = _case("qwen3-14b", [17, 333, 1024, 4099])
    case = random_row_case(base, rows=rows, pooled=pooled)
    parts = split_rows(case, base.kv.shape[2], first=first)
    work = decode_partials(case.q, case.k_cache, case.block_tables.shape[2], 2, num_kv_heads=case.num_kv_heads)
    out = torch.full_like(case.q, float("nan"))

    (first_tables, first_lens), (last_tables, last_lens) = parts

    def attend():
        attend_part(work, 0, case.q, case.k_cache, case.v_cache, first_tables, first_lens, case.scale,
                    num_kv_heads=case.num_kv_heads)
        attend_last_part(work, case.q, case.k_cache, case.v_cache, last_tables, last_lens, case.scale, out,
                         num_kv_heads=case.num_kv_heads)

    attend()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attend()
    out.fill_(float("nan"))
    graph.replay()
    _assert_close(out.clone(), case.expect.to(out.dtype))
