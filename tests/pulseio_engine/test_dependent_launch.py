"""Programmatic dependent launch: where it is on, and, on a GPU, that a chain of kernels each reading the one
before's output gives the same bits with it as without it (a kernel that read before its predecessor finished
would not)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.needs_package("triton")   # the module imports it inside its tests

ENV = "PULSEIO_ENGINE_PDL"


@pytest.fixture
def fresh_decision():
    from pulseio_engine.dependent_launch import dependent_launch

    dependent_launch.cache_clear()
    yield dependent_launch
    dependent_launch.cache_clear()


def test_off_on_cpu_and_with_the_switch(monkeypatch: pytest.MonkeyPatch, fresh_decision) -> None:  # noqa: ANN001
    from pulseio_engine.dependent_launch import launch_options

    dependent_launch = fresh_decision
    assert dependent_launch(torch.device("cpu")) is False
    monkeypatch.setenv(ENV, "0")
    assert dependent_launch(torch.device("cuda")) is False      # decided before any CUDA call
    assert launch_options(False) == {} and launch_options(True) == {"launch_pdl": True}


def _chain(x: torch.Tensor, weights: list[torch.Tensor], graphs: bool) -> torch.Tensor:
    """x through each weight in turn by `skinny_linear` (split-K where N is narrow), captured in a CUDA graph."""
    from pulseio_engine.model.skinny_gemm import SkinnyWorkspace, skinny_linear

    ws = SkinnyWorkspace.allocate(max(w.shape[0] for w in weights), max_split_k=8, device=x.device)
    outs = [torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device) for w in weights]

    def run() -> None:
        h = x
        for w, out in zip(weights, outs, strict=True):
            h = skinny_linear(h, w, out=out, workspace=ws)

    run()                                  # compiles outside the capture
    if graphs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        for out in outs:
            out.zero_()
        graph.replay()
    torch.cuda.synchronize()
    return outs[-1].clone()


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_a_kernel_chain_gives_the_same_bits_with_and_without_it(
        monkeypatch: pytest.MonkeyPatch, fresh_decision, graphs: bool) -> None:  # noqa: ANN001
    dependent_launch = fresh_decision
    gen = torch.Generator(device="cuda").manual_seed(0)
    dims = [2048, 8192, 1024, 8192, 2048, 4096, 512]    # wide and narrow N: split-K and not
    weights = [torch.randn((n, k), device="cuda", dtype=torch.bfloat16, generator=gen) / k ** 0.5
               for k, n in zip(dims, dims[1:], strict=False)]
    x = torch.randn((8, dims[0]), device="cuda", dtype=torch.bfloat16, generator=gen)
    runs = {}
    for pdl in ("1", "0"):
        monkeypatch.setenv(ENV, pdl)
        dependent_launch.cache_clear()
        runs[pdl] = _chain(x, weights, graphs)
    if torch.cuda.get_device_capability()[0] >= 9:
        dependent_launch.cache_clear()
        monkeypatch.setenv(ENV, "1")
        assert dependent_launch(x.device), "sm_90 with this Triton should launch with PDL"
    assert torch.equal(runs["1"], runs["0"])
    ref = x.float()
    for w in weights:
        ref = (ref @ w.float().T).to(torch.bfloat16).float()
    torch.testing.assert_close(runs["1"].float(), ref, rtol=0.05, atol=0.05)
