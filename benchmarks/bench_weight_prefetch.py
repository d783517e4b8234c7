"""Does the output projection's weight, asked of the L2 while Quest's selection chain runs, make the layer faster?

One all-on-GPU Quest layer at qwen3-14b's 8 x 32K shape (budget 2048): score -> select -> attention over the
selected pages in place (`bench_fused_selection.Layer`), then o_proj (cuBLAS, 5120 x 5120 bf16: 50 MiB) and the
MLP's gate_up projection (340 MiB, which also clears the L2 for the next call). The chain reads ~130 MB in
~65 us and leaves the HBM idle in its select and in its attention's ramps; the variants fork a side stream that
prefetches o_proj's weight into the L2 (`cp.async.bulk.prefetch.L2`, 4 KiB a thread, optionally with an
evict-last policy) beside the chain, and join it before o_proj; or launch the prefetch on the main stream (its
instructions only ask: the kernel may end before the bytes arrive).

Measured on an H100 (benchmarks/results/sparse-step-2026-12-07-h100/): no variant made the layer faster, and
o_proj read twice in a row was no faster the second time (its 50 MiB do not stay in a 50 MiB L2), so the engine
does not prefetch.

Usage (repo root): PYTHONPATH=. python benchmarks/bench_weight_prefetch.py [--context 32800]
Each line is the median of 15 CUDA-graph replays of 10 back-to-back calls, per call (`time_graph_us`).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run without PYTHONPATH too

from bench_attention import time_graph_us  # noqa: E402
from bench_fused_selection import HQ, D, Layer, QuestChain  # noqa: E402

_EVICT_LAST = tl.constexpr(
    "{ .reg .b64 pol; createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
    "cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], 4096, pol; mov.u32 $0, 0; }"
)
_NORMAL = tl.constexpr("{ cp.async.bulk.prefetch.L2.global [$1], 4096; mov.u32 $0, 0; }")
_PER_PROGRAM = 128  # 4 KiB prefetches a program, one a thread


@triton.jit
def _l2_prefetch_kernel(base, nbytes, PER_PROGRAM: tl.constexpr, EVICT_LAST: tl.constexpr):
    offs = (tl.program_id(0) * PER_PROGRAM + tl.arange(0, PER_PROGRAM)).to(tl.int64) * 4096
    addr = tl.where(offs + 4096 <= nbytes, base + offs, base)  # whole chunks only: never past the tensor
    if EVICT_LAST:
        tl.inline_asm_elementwise(_EVICT_LAST, "=r,l", [addr], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise(_NORMAL, "=r,l", [addr], dtype=tl.int32, is_pure=False, pack=1)


def prefetch(t: torch.Tensor, nbytes: int, evict_last: bool) -> None:
    """Ask the L2 for the first `nbytes` of contiguous t, in whole 4 KiB chunks."""
    grid = (triton.cdiv(nbytes // 4096, _PER_PROGRAM),)
    _l2_prefetch_kernel[grid](
        t.view(-1).view(torch.uint8), nbytes, PER_PROGRAM=_PER_PROGRAM, EVICT_LAST=evict_last, num_warps=4
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=32800)
    parser.add_argument("--budget", type=int, default=2048)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(0), torch.__version__, triton.__version__, flush=True)
    layer = Layer(args.batch, args.context, args.budget)
    b = layer.b
    chain = QuestChain(layer)
    score, select, attend, attn = chain.score, chain.select, chain.attend, chain.attn
    gen = torch.Generator(device="cuda").manual_seed(2)
    hidden = HQ * D
    w_o = torch.randn((hidden, hidden), generator=gen, dtype=torch.bfloat16, device="cuda") * 0.01
    w_gate_up = torch.randn((2 * 17408, hidden), generator=gen, dtype=torch.bfloat16, device="cuda") * 0.01
    o_bytes = w_o.numel() * w_o.element_size()
    side, scored, started = torch.cuda.Stream(), torch.cuda.Event(), torch.cuda.Event()
    sink = {}

    def o_proj() -> None:
        sink["o"] = F.linear(attn.view(b, hidden), w_o)

    def mlp() -> None:
        sink["gu"] = F.linear(sink["o"], w_gate_up)

    def layer_with(fork: str | None, nbytes: int = o_bytes, evict_last: bool = True):
        def run() -> None:
            main = torch.cuda.current_stream()
            if fork == "start":
                started.record(main)
                side.wait_event(started)
                with torch.cuda.stream(side):
                    prefetch(w_o, nbytes, evict_last)
            if fork == "serial":
                prefetch(w_o, nbytes, evict_last)
            score()
            if fork == "scored":
                scored.record(main)
                side.wait_event(scored)
                with torch.cuda.stream(side):
                    prefetch(w_o, nbytes, evict_last)
            select()
            attend()
            if fork in ("start", "scored"):
                main.wait_stream(side)
            o_proj()
            mlp()

        return run

    def o_twice() -> None:
        o_proj()
        o_proj()
        mlp()

    o_proj()
    rows = [
        ("mlp (gate_up) alone", mlp),
        ("o_proj + mlp", lambda: (o_proj(), mlp())),
        ("o_proj twice + mlp (the second from the L2)", o_twice),
        ("score -> select -> attention", chain.run),
        ("layer", layer_with(None)),
        ("layer, prefetch on the main stream first", layer_with("serial")),
        ("layer, prefetch beside it from its start", layer_with("start")),
        ("layer, prefetch beside it once scored", layer_with("scored")),
        ("layer, prefetch beside it once scored, normal policy", layer_with("scored", evict_last=False)),
        ("layer, 32 MiB prefetched beside it once scored", layer_with("scored", 32 << 20)),
        ("layer, 40 MiB prefetched beside it from its start", layer_with("start", 40 << 20)),
        ("layer", layer_with(None)),
    ]
    for label, fn in rows:
        print(f"{label:56s}: {time_graph_us(fn):8.1f} us", flush=True)


if __name__ == "__main__":
    main()
