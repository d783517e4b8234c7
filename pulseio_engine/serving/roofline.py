"""The replay's decode rounds against the least time they could take: the serving roofline.

Every decode step of a round reads, per batch, the weights once and the KV its attention reads (`step_bytes`:
a dense request's whole KV; a sparse one's dense layers whole, its digests and its selected blocks), and the
offload batch's recalls cross the link. `RoundBytes` sums those bytes over the rounds as they are launched;
`roofline` puts them over the device's copy bandwidth and the link's, both measured before the clock starts:
the larger of the two times is the least the replay's decode steps could take at the batches it ran, and
`ratio` is the rounds' time over it (1.0: at the roofline). A round's prefill (real models only) is not
counted, so such rounds only raise the ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..step_bytes import StepShape, step_bytes


@dataclass
class RoundBytes:
    """Bytes the decode steps launched so far must read from device memory: weights and the rest."""

    weights: int = 0
    kv: int = 0                  # KV, digests and bookkeeping
    steps: int = 0               # batch steps (a round of two batches, one step each: 2)

    def add(self, shape: StepShape, contexts: Sequence[int], steps: int, *, offload: bool, riding: bool = False
            ) -> None:
        """`steps` decode steps of requests of `contexts` tokens (each step one token longer than the one before)
        on an engine of `shape`; `offload`: its selected blocks come from hot sets. `riding`: the requests ride in
        another batch's step, which reads the weights (their KV only)."""
        for step in range(steps):
            b = step_bytes(shape, [c + step for c in contexts], offload=offload)
            weights = 0 if riding else b.weights
            self.weights, self.kv = self.weights + weights, self.kv + b.total - b.weights
            self.steps += 0 if riding else 1


def roofline(read: RoundBytes, recalled_bytes: int, rounds_s: float, tokens: int, *, copy_gbps: float | None,
             link_gbps: float | None) -> dict:
    """The report's `roofline` section: the bytes, the rates, the bound and the rounds' ratio to it (the bound
    and ratio None without a measured copy bandwidth, as on a CPU, whose decode is bound by its arithmetic)."""
    hbm_s = None if copy_gbps is None else (read.weights + read.kv) / (copy_gbps * 1e9)
    link_s = None if link_gbps is None or not recalled_bytes else recalled_bytes / (link_gbps * 1e9)
    bound_s = None if hbm_s is None else max(hbm_s, link_s or 0.0)
    return {"weights_bytes": read.weights, "kv_bytes": read.kv, "batch_steps": read.steps,
            "recalled_bytes": recalled_bytes, "copy_gbps": copy_gbps, "link_gbps": link_gbps, "hbm_s": hbm_s,
            "link_s": link_s, "bound_s": bound_s, "rounds_s": rounds_s,
            "ratio": None if not bound_s else rounds_s / bound_s,
            "bound_tok_s": None if not bound_s else tokens / bound_s}
