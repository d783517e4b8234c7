"""A synthetic block selection with a given step-to-step locality, for benchmarks on random weights.

With random weights the query . digest top-k jumps at random every step, so a benchmark would recall
nearly the whole budget each step: far more traffic than a real model makes. `LocalitySelector` stands
in for `select_for_layer` there. At each step and layer it keeps a fraction `overlap[layer]` of the
middle blocks from that layer's previous selection (the figure `pulseio-engine locality` measures on
real models, shipped in `pulseio_engine/data/locality.json`) and draws the rest at random among the
middle blocks the previous step did not select.

Protocol (`kv/selection.BlockSelector`, the call of `select_for_layer` minus the digests):

    selector(layer, q, block_tables, num_tokens) -> [B, S, K] int64

- q: [B, Hq, D], read for B and its device only; block_tables: [B, NB], read for NB only;
  num_tokens: [B] int64 tokens in context, the one being decoded included.
- The output keeps `select_blocks`' contract: block ids ascending, padded with -1, only blocks < n
  (n = ceil(num_tokens / block_size)), sink blocks [0, sink) and local blocks [n - local, n) always in,
  and all n blocks when n <= K.

Middle blocks are [sink, n - local); a row has m = K - sink - local middle slots. A row keeps
floor(overlap * m + u) of its previous middle blocks, u ~ U[0, 1), so on average overlap * m exactly;
which ones is random. That is the quantity the measurement reports: |middle_t & sel_{t-1}| / |middle_t|.
Two limits bend it: on a layer's first step (or after the batch changed shape) there is no previous
selection, so every middle block is fresh; when fewer fresh candidates remain than slots to fill (a
budget near the context), previously selected blocks fill them and the overlap comes out higher.

State: each layer's last selection, by batch row: row i is assumed to be the same request as at the
previous call (a fixed decode batch); a call with another batch size starts that layer afresh, and
`reset()` forgets every layer. Everything is fixed-shape torch on q's device: no host sync, no
data-dependent shape, no loop per block or request; randomness comes from one seeded
`torch.Generator` on that device, so a run is reproducible. (Capturing calls in a CUDA graph would
need that generator registered with the graph; nothing here does it.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..config import SparseConfig
from .selection import PAD

_FORCED, _KEPT, _FRESH, _OUT = 4.0, 3.0, 1.0, -1.0   # sort keys: fresh = 1 + u, stale = u, u in [0, 1)


class LocalitySelector:
    """Selections whose middle blocks overlap the previous step's by `overlap[layer]` (see the module doc)."""

    def __init__(self, config: SparseConfig, overlap: Sequence[float], *, rows: int,
                 device: torch.device | str, seed: int = 0) -> None:
        """overlap: one fraction in [0, 1] per model layer, indexed by layer id (entries of layers that
        never call are unused); rows: selecting rows S per request (1 for SoloHead, Hkv for Quest)."""
        bad = [o for o in overlap if isinstance(o, bool) or not isinstance(o, (int, float)) or not 0.0 <= o <= 1.0]
        if bad:
            raise ValueError(f"LocalitySelector overlap fractions must be numbers in [0, 1], got {bad[:3]}")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"LocalitySelector.rows must be an int >= 1, got {rows!r}")
        self.config = config
        self.overlap = tuple(float(o) for o in overlap)
        self.rows = rows
        self.device = torch.device(device)
        self.seed = seed
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._previous: dict[int, torch.Tensor] = {}     # layer -> [B, S, K] last selection

    def reset(self) -> None:
        """Forget every layer's previous selection and restart the random stream from the seed."""
        self._previous.clear()
        self.generator.manual_seed(self.seed)

    def __call__(self, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
                 num_tokens: torch.Tensor) -> torch.Tensor:
        if not 0 <= layer < len(self.overlap):
            raise IndexError(f"layer {layer} has no overlap fraction; this selector was given "
                             f"{len(self.overlap)} (one per model layer)")
        c, b, k = self.config, q.shape[0], self.config.budget_blocks
        width = max(block_tables.shape[1], k)
        ids = torch.arange(width, device=q.device)                                       # [W]
        n = ((num_tokens.long() + c.block_size - 1) // c.block_size)[:, None, None]      # [B, 1, 1] blocks
        real = ids < n                                                                   # [B, 1, W]
        forced = real & ((ids < c.sink_blocks) | (ids >= n - c.local_blocks))
        middle = real & ~forced
        u = torch.rand((b, self.rows, width + 1), generator=self.generator, device=q.device)
        u, u_round = u[..., :width], u[..., width:]                                      # [B, S, W], [B, S, 1]
        was = self._was_selected(layer, b, width, q.device)                              # [B, S, W]
        stale = middle & was
        keep = torch.floor(self.overlap[layer] * (k - c.sink_blocks - c.local_blocks) + u_round)  # [B, S, 1]
        kept = stale & (_rank(torch.where(stale, u, 2.0)) < keep)        # a random `keep` of the stale ones
        key = torch.where(middle, torch.where(was, u, _FRESH + u), _OUT)
        key = torch.where(forced, _FORCED, torch.where(kept, _KEPT, key))
        top = key.topk(k, dim=2)                                                         # [B, S, K]
        chosen = torch.where(top.values >= 0, top.indices, width).sort(dim=2).values
        selected = torch.where(chosen < width, chosen, PAD)
        self._previous[layer] = selected
        return selected

    def _was_selected(self, layer: int, b: int, width: int, device: torch.device) -> torch.Tensor:
        """[B, S, W] bool: the blocks this layer selected at the previous call (none on a first call or
        when the batch size changed: a host-side shape check, no sync)."""
        marks = torch.zeros((b, self.rows, width + 1), dtype=torch.bool, device=device)
        prev = self._previous.get(layer)
        if prev is not None and prev.shape[:2] == (b, self.rows):
            marks.scatter_(2, torch.where(prev >= 0, prev, width).clamp(max=width), True)
        return marks[..., :width]


def _rank(key: torch.Tensor) -> torch.Tensor:
    """key: [..., W] -> [..., W] int64: each entry's position in its row sorted ascending."""
    order = key.argsort(dim=-1)
    return torch.empty_like(order).scatter_(-1, order, torch.arange(key.shape[-1], device=key.device)
                                            .expand_as(order).contiguous())
