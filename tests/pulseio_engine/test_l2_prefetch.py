"""`model.l2_prefetch`: the prefetch kernel compiles for sm_90 to one bulk L2 prefetch a thread with an evict-last
policy, is refused where it cannot run, and on a GPU leaves every byte as it was inside a captured branch."""

from __future__ import annotations

import pytest
import torch

from pulseio_engine.model.l2_prefetch import L2Prefetch, supports_l2_prefetch


def test_kernel_compiles_for_sm90_to_bulk_prefetches() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pulseio_engine.model.l2_prefetch import _l2_prefetch_kernel

    signature = {"base": "*u8", "nbytes": "i64", "PER_PROGRAM": "constexpr"}
    kernel = triton.compile(ASTSource(fn=_l2_prefetch_kernel, signature=signature, constexprs={(2,): 128}),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    lines = [line for line in kernel.asm["ptx"].splitlines() if "cp.async.bulk.prefetch.L2" in line]
    assert len(lines) == 1 and "createpolicy.fractional.L2::evict_last" in lines[0] and "4096" in lines[0]


def test_refused_on_a_cpu() -> None:
    assert not supports_l2_prefetch(torch.device("cpu"))
    with pytest.raises(ValueError, match="Hopper"):
        L2Prefetch(torch.device("cpu"))


@pytest.mark.gpu
def test_captured_prefetch_changes_no_byte() -> None:
    if not torch.cuda.is_available() or not supports_l2_prefetch(torch.device("cuda")):
        pytest.skip("needs a Hopper GPU")
    dev = torch.device("cuda")
    weight = torch.randn((5120, 5120 + 8), dtype=torch.bfloat16, device=dev)   # not a whole number of 4 KiB chunks
    before = weight.clone()
    x = torch.randn((8, 5120 + 8), dtype=torch.bfloat16, device=dev)
    prefetch = L2Prefetch(dev)
    with prefetch.beside(weight):       # compiles the kernel before the capture
        pass
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with prefetch.beside(weight):
            y = x * 2
        out = torch.nn.functional.linear(y, weight)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(weight, before)
    assert torch.equal(out, torch.nn.functional.linear(x * 2, before))
