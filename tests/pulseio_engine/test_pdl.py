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
