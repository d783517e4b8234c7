"""The Triton kernels under TRITON_INTERPRET=1 on CPU tensors, against the reference.

The interpreter must be switched on before Triton is first imported, so the cases run in one child
process (this file run as a script) and each test checks its case's result. Runs only where there is
no CUDA device (the gpu tests cover the compiled kernel) and Triton is installed. The interpreter's bf16
`tl.dot` is wrong (numpy has no bf16), so these cases use fp32 and fp16.
"""

from __future__ import annotations

import pytest
import torch
from interpreted import interpreted_results, run_cases

# id -> (random_paged_case kwargs, DecodeConfig fields (block_n, warps, stages, splits[, prefetch]) or None, tol)
CASES = {
    "mha-direct": (dict(num_q_heads=4, num_kv_heads=4, head_dim=64, block_size=16), (16, 4, 2, 1), 1e-5),
    "smollm-g3-tile-spans-4-pages": (
        dict(num_q_heads=9, num_kv_heads=3, head_dim=64, block_size=16),
        (64, 4, 2, 3),
        1e-5,
    ),
    "g5-d128-tile-smaller-than-page": (
        dict(num_q_heads=10, num_kv_heads=2, head_dim=128, block_size=32),
        (16, 4, 2, 2),
        1e-5,
    ),
    "g5-page64-more-splits-than-tiles": (
        dict(num_q_heads=10, num_kv_heads=2, head_dim=128, block_size=64),
        (32, 4, 2, 7),
        1e-5,
    ),
    "register-prefetch-variant": (
        dict(num_q_heads=10, num_kv_heads=2, head_dim=64, block_size=16),
        (32, 4, 1, 3, True),
        1e-5,
    ),
    "mostly-empty-splits": (
        dict(num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=16),
        (16, 4, 2, 24),
        1e-5,
    ),
    "fp16-sharp-softmax": (
        dict(num_q_heads=10, num_kv_heads=2, head_dim=64, dtype="float16", q_scale=8.0),
        (32, 4, 2, 2),
        1e-2,
    ),
    "strided-block-table-and-lengths": (
        dict(num_q_heads=9, num_kv_heads=3, head_dim=64, strided_meta=True),
        (32, 4, 2, 2),
        1e-5,
    ),
    # an offload request's head-wise (Quest) hot set: each selecting row is one KV head with its G query heads
    "quest-hot-row-one-kv-head": (
        dict(num_q_heads=3, num_kv_heads=1, head_dim=64, block_size=16),
        (16, 4, 2, 2),
        1e-5,
    ),
    "default-config-wide-table": (
        dict(num_q_heads=9, num_kv_heads=3, head_dim=64, max_blocks=64),
        None,
        1e-5,
    ),
    # context_lens > max_blocks * block_size breaks the contract; the kernel clamps, never reads past the row
    "overlong-context-is-clamped": (
        dict(
            num_q_heads=4,
            num_kv_heads=2,
            head_dim=64,
            lens=[48, 48],
            max_blocks=3,
            poison=False,
            overlong=100,
        ),
        (16, 4, 2, 3),
        1e-5,
    ),
}
LENS = [1, 17, 64, 150]
# row tables (sparse attention): id -> (rows S, pooled per-row units, Hq, Hkv, DecodeConfig fields or None)
ROW_CASES = {
    "rows-per-kv-head-paged": (4, False, 8, 4, (16, 4, 2, 2)),            # Quest on the paged cache
    "rows-per-kv-head-pooled": (4, True, 8, 4, (32, 4, 2, 3)),            # Quest's hot slots: 1 head a unit
    "one-row-all-heads-pooled": (1, True, 10, 2, None),                  # SoloHead's hot slots
    "two-rows-of-two-heads-paged": (2, False, 12, 4, (16, 4, 2, 1)),
}

# two tables a row, the first attended in splits, the last in one launch that merges them (attention.decode_partials):
# id -> (rows S, pooled, Hq, Hkv, the share of pages in the first table, the first part's splits or None: the rule's)
PART_CASES = {
    "parts-solohead-hot-dealt": (1, True, 10, 2, 0.7, None),
    "parts-quest-hot-second-empty": (2, True, 8, 2, 1.0, None),
    "parts-paged-first-empty": (2, False, 12, 4, 0.0, None),
    "parts-solohead-hot-dealt-3-splits": (1, True, 10, 2, 0.7, 3),
    "parts-quest-hot-first-empty-2-splits": (2, True, 8, 2, 0.0, 2),
    "parts-quest-hot-second-empty-4-splits": (2, True, 8, 2, 1.0, 4),
}


def _run_case(kwargs: dict, config: tuple | None) -> dict:
    from pulseio_engine.attention import paged_decode_attention_reference
    from pulseio_engine.attention._launch import DecodeConfig, paged_decode_attention_triton
    from pulseio_engine.attention.testing import random_paged_case

    kwargs = dict(kwargs, dtype=getattr(torch, kwargs.get("dtype", "float32")))
    kwargs.setdefault("max_blocks", 160 // kwargs.get("block_size", 16) + 1)
    overlong = kwargs.pop("overlong", 0)
    strided_meta = kwargs.pop("strided_meta", False)
    case = random_paged_case(context_lens=kwargs.pop("lens", LENS), **kwargs)
    tables, lens = case.block_tables, case.context_lens + overlong
    if strided_meta:  # block table and lengths as column views of wider buffers
        tables = torch.stack([tables, torch.full_like(tables, -5)], dim=2)[:, :, 0]
        lens = torch.stack([lens, torch.full_like(lens, 10**6)], dim=1)[:, 0]
    expect = paged_decode_attention_reference(
        case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale
    ).float()
    out = torch.full_like(case.q, float("nan"))
    got = paged_decode_attention_triton(
        case.q,
        case.k_cache,
        case.v_cache,
        tables,
        lens,
        case.scale,
        out=out,
        config=DecodeConfig(*config) if config else None,
    )
    return {
        "same_out": got is out,
        "max_err": (got.float() - expect).abs().max().item(),
        "max_ref": expect.abs().max().item(),
    }


def _run_row_case(rows: int, pooled: bool, hq: int, hkv: int, config: tuple | None) -> dict:
    from pulseio_engine.attention._launch import DecodeConfig, paged_decode_attention_triton
    from pulseio_engine.attention.testing import random_paged_case, random_row_case

    base = random_paged_case(context_lens=LENS, num_q_heads=hq, num_kv_heads=hkv, head_dim=64, max_blocks=11)
    case = random_row_case(base, rows=rows, pooled=pooled)
    out = torch.full_like(case.q, float("nan"))
    got = paged_decode_attention_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens,
                                        case.scale, out=out, config=DecodeConfig(*config) if config else None,
                                        num_kv_heads=case.num_kv_heads)
    return {"same_out": got is out, "max_err": (got.double() - case.expect).abs().max().item(),
            "max_ref": case.expect.abs().max().item()}


def _run_part_case(rows: int, pooled: bool, hq: int, hkv: int, first: float, splits: int | None) -> dict:
    from dataclasses import replace

    from pulseio_engine.attention import DecodePartials, attend_last_part, attend_part, decode_partials
    from pulseio_engine.attention.testing import random_paged_case, random_row_case, split_rows

    base = random_paged_case(context_lens=LENS, num_q_heads=hq, num_kv_heads=hkv, head_dim=64, max_blocks=11)
    case = random_row_case(base, rows=rows, pooled=pooled)
    work = decode_partials(case.q, case.k_cache, 11, 2, num_kv_heads=case.num_kv_heads, use_triton=True)
    if splits is not None:  # the rule gives these small tables one split: the merge of several is tried too
        batch, _, head_dim = case.q.shape
        work = DecodePartials(torch.zeros((batch, hq, 2 * splits, head_dim)),
                              torch.full((batch, hq, 2 * splits), float("-inf")), splits,
                              replace(work.config, num_splits=splits))
    (first_tables, first_lens), (last_tables, last_lens) = split_rows(case, 16, first=first)
    attend_part(work, 0, case.q, case.k_cache, case.v_cache, first_tables, first_lens, case.scale,
                num_kv_heads=case.num_kv_heads)
    out = torch.full_like(case.q, float("nan"))
    got = attend_last_part(work, case.q, case.k_cache, case.v_cache, last_tables, last_lens, case.scale, out,
                           num_kv_heads=case.num_kv_heads)
    return {"same_out": got is out, "max_err": (got.double() - case.expect).abs().max().item(),
            "max_ref": case.expect.abs().max().item(), "triton": work.config is not None}


def _main() -> None:
    runs = [(name, _run_case, (kwargs, config)) for name, (kwargs, config, _) in CASES.items()]
    runs += [(name, _run_part_case, args) for name, args in PART_CASES.items()]
    run_cases(runs + [(name, _run_row_case, args) for name, args in ROW_CASES.items()])


@pytest.fixture(scope="module")
def results() -> dict:
    return interpreted_results(__file__)


@pytest.mark.needs_package("triton")
@pytest.mark.parametrize("name", list(CASES) + list(ROW_CASES) + list(PART_CASES))
def test_interpreted_kernel_matches_reference(results, name):
    """Plain cases against the torch reference; row-table cases against naive float64 attention over each
    row's selected tokens (poisoned pages and table entries must not be read)."""
    result = results[name]
    assert "error" not in result, result.get("error")
    assert result["same_out"], "the kernel must write into and return the given out tensor"
    assert result.get("triton", True), "the Triton kernels ran, not the reference"
    assert result["max_ref"] > 0.1  # the check below is not vacuous
    tol = CASES[name][2] if name in CASES else 1e-5
    assert result["max_err"] <= tol * max(1.0, result["max_ref"]), result


if __name__ == "__main__":
    _main()
