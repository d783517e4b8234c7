"""Programmatic dependent launch (`pulseio_engine.pdl`): off unless asked for, and on a Hopper GPU a captured
chain of dependent engine kernels gives the same bits launched either way (a kernel that read its input before
`gdc_wait` would read the previous replay's)."""

from __future__ import annotations

import pytest
import torch

from pulseio_engine.pdl import launches_pdl, pdl_meta


def test_off_by_default_and_never_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PULSEIO_PDL", raising=False)
    assert pdl_meta(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setenv("PULSEIO_PDL", "1")
    assert not launches_pdl(torch.device("cpu"))
    assert pdl_meta(torch.device("cpu")) == {"PDL": False}


def _chain(x: torch.Tensor, weights: list[torch.Tensor], q: torch.Tensor, k_cache: torch.Tensor,
           v_cache: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor, ws) -> torch.Tensor:  # noqa: ANN001
    """Projections each reading the last one's output, then attention whose query is the last of them."""
    from pulseio_engine.attention import paged_decode_attention
    from pulseio_engine.model.skinny_gemm import skinny_linear

    for w in weights:
        x = skinny_linear(x, w, workspace=ws)
    q = q + x[:, : q[0].numel()].view_as(q)
    return paged_decode_attention(q, k_cache, v_cache, tables, lens, q.shape[-1] ** -0.5)


@pytest.mark.gpu
def test_gpu_captured_dependent_chain_gives_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    from pulseio_engine.model.skinny_gemm import SkinnyWorkspace

    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev)[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    g = torch.Generator(device=dev).manual_seed(0)
    n = 5120
    weights = [torch.randn((n, n), generator=g, device=dev, dtype=torch.bfloat16) * n ** -0.5 for _ in range(4)]
    x = torch.randn((8, n), generator=g, device=dev, dtype=torch.bfloat16)
    hq, hkv, d, page, pages = 40, 8, 128, 16, 4096
    q = torch.randn((8, hq, d), generator=g, device=dev, dtype=torch.bfloat16)
    k_cache = torch.randn((pages, page, hkv, d), generator=g, device=dev, dtype=torch.bfloat16)
    v_cache = torch.randn((pages, page, hkv, d), generator=g, device=dev, dtype=torch.bfloat16)
    tables = torch.randperm(pages, generator=g, device=dev)[: 8 * 256].view(8, 256).to(torch.int32)
    lens = torch.full((8,), 256 * page - 5, dtype=torch.int32, device=dev)
    ws = SkinnyWorkspace.allocate(n, max_split_k=8, device=dev)
    x0 = x.clone()
    results = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("PULSEIO_PDL", flag)
        x.copy_(x0)
        assert launches_pdl(dev) == (flag == "1")
        _chain(x, weights, q, k_cache, v_cache, tables, lens, ws)            # compiled before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _chain(x, weights, q, k_cache, v_cache, tables, lens, ws)
        runs = []
        for _ in range(3):
            x.add_(0.5)                         # new inputs each replay: a stale read would show
            graph.replay()
            runs.append(out.clone())
        torch.cuda.synchronize()
        results[flag] = runs
    for plain, dependent in zip(results["0"], results["1"], strict=True):
        assert torch.equal(plain, dependent)
    assert not torch.equal(results["0"][0], results["0"][1])   # the inputs changed what came out


_OFFLINE = {  # kernel -> (pointer types, constexprs of one launch; PDL added by the test)
    "split": ("pulseio_engine.attention._kernel:_paged_decode_split_kernel",
              dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", bt_ptr="*i32", lens_ptr="*i32", o_ptr="*fp32",
                   lse_ptr="*fp32", prior_part_ptr="*fp32", prior_lse_ptr="*fp32", scale_log2="fp32"),
              dict(GROUP=5, GROUP_PAD=16, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_N=64, DIRECT=False,
                   DOT_PRECISION="tf32", PREFETCH=False, HEADS_PER_ROW=1, CACHE_HEADS=8, PRIOR=0)),
    "reduce": ("pulseio_engine.attention._kernel:_reduce_splits_kernel",
               dict(part_ptr="*fp32", lse_ptr="*fp32", out_ptr="*bf16"), dict(SPLITS_PAD=8, HEAD_DIM=128)),
    "score": ("pulseio_engine.kv.select_kernels:_score_kernel",
              dict(q_ptr="*bf16", dmax_ptr="*bf16", dmin_ptr="*bf16", bt_ptr="*i32", out_ptr="*fp32",
                   count_ptr="*i64"),
              dict(GROUP=5, HEAD_DIM=128, TILE=64, MAX_NORM=False, HAS_COUNT=False)),
    "store": ("pulseio_engine.kv.store_kernel:_store_tokens_kernel",
              dict(k_ptr="*bf16", v_ptr="*bf16", pool_ptr="*bf16", units_ptr="*i64", offsets_ptr="*i64",
                   dmax_ptr="*bf16", dmin_ptr="*bf16", dblock_ptr="*i64"),
              dict(HEADS_PER_UNIT=8, HEAD_DIM=128, DIGEST=True, ALL_HEADS_DIGESTED=True)),
    "skinny": ("pulseio_engine.model.skinny_gemm:_skinny_gemm_kernel",
               dict(x_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16", part_ptr="*fp32", count_ptr="*i32"),
               dict(M_PAD=16, BLOCK_N=64, BLOCK_K=128, SPLIT=True, USE_DOT=True, EVEN_K=True, DOT_FP32=False,
                    PREFETCH_LINES=8)),
}


@pytest.mark.needs_package("triton")
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("name", list(_OFFLINE))
def test_kernels_compile_for_sm90_waiting_only_as_dependents(name: str, pdl: bool) -> None:
    """Each engine kernel compiles for sm_90 with and without PDL (offline: no GPU), and only its PDL build waits
    for the kernel before it and lets the next one launch."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    where, pointers, const = _OFFLINE[name]
    module, attr = where.split(":")
    fn = getattr(importlib.import_module(module), attr)
    const = dict(const, PDL=pdl)
    signature = {n: "constexpr" if n in const else pointers.get(n, "i32") for n in fn.arg_names}
    constexprs = {(fn.arg_names.index(n),): v for n, v in const.items()}
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "launch_pdl": pdl})
    ptx = kernel.asm["ptx"]
    assert ("griddepcontrol.wait" in ptx) == pdl and ("griddepcontrol.launch_dependents" in ptx) == pdl
    assert ("prefetch.global.L2" in ptx) == (pdl and name == "skinny")
