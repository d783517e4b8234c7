"""The concurrent work of the bench's under-load rows: a bf16 GEMM looped on a stream of its own."""

from __future__ import annotations

import torch


class GemmLoad:
    """`size`^3 bf16 GEMMs (compute-bound, every SM busy) enqueued on a private stream."""

    def __init__(self, device: torch.device | str = "cuda", size: int = 8192) -> None:
        self.a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
        self.b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
        self.c = torch.empty_like(self.a)
        self.stream = torch.cuda.Stream(self.a.device)

    def enqueue(self, iters: int) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        """Enqueue `iters` GEMMs between two timing events; returns (start, end). Never waits."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record()
            for _ in range(iters):
                torch.mm(self.a, self.b, out=self.c)
            end.record()
        return start, end
