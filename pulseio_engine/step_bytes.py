"""What one decode step must read from device memory: the numerator of every roofline here (the dense and the
sparse bench, the replay's rounds).

A dense step reads every weight once (the embedding as the B rows gathered, every other matrix in full) and
every cached K/V of the batch once, counted in tokens, not whole blocks. A sparse step reads the weights, the
dense layers' KV whole, and for each other layer and request either its whole KV (a request within the token
budget attends to all of it and selects nothing) or the selecting heads' digests of every block, the selected
blocks and the selection's and recall's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .kv.cache import kv_bytes_per_token

if TYPE_CHECKING:
    from .engine import Engine


def decode_bytes_per_step(engine: Engine, batch_size: int, mean_context: float) -> tuple[int, int]:
    """(weight bytes, KV bytes) one dense decode step of `batch_size` requests of `mean_context` tokens reads."""
    cfg, w = engine.config.model, engine.model.weights
    item = w.embed.element_size()
    weights = w.parameter_bytes()
    if not cfg.tie_word_embeddings:   # the embedding table is gathered, not read whole
        weights += batch_size * cfg.hidden_size * item - w.embed.numel() * item
    per_token = kv_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, engine.kv.dtype)
    return weights, int(batch_size * mean_context * per_token)


@dataclass(frozen=True)
class SparseStepBytes:
    """What one sparse decode step must read from device memory, in bytes (its roofline's numerator)."""

    weights: int          # every weight once (the embedding's gathered rows)
    dense_kv: int         # the dense layers' whole KV (and every layer's of a request within the budget)
    digests: int          # the selecting heads' key max and min, every block of every offloaded layer
    selected_kv: int      # the selected blocks' K and V, every offloaded layer and row
    bookkeeping: int      # bounds written and read, masks, block tables, residency and hot-set maps

    @property
    def total(self) -> int:
        return self.weights + self.dense_kv + self.digests + self.selected_kv + self.bookkeeping


def sparse_step_bytes(engine: Engine, contexts: Sequence[float], *, offload: bool) -> SparseStepBytes:
    """The bytes of `SparseStepBytes` for one step of requests of `contexts` tokens on `engine` (its model, sparse
    config, selection width and dtype); `offload`: the requests' selected blocks come from hot sets."""
    off = engine.offloader
    assert off is not None
    m, sparse = engine.config.model, off.sparse
    item = engine.kv.dtype.itemsize
    weights, _ = decode_bytes_per_step(engine, len(contexts), 0.0)
    layers, dense = m.num_layers - off.dense, off.dense
    token_kv = 2 * m.num_kv_heads * m.head_dim * item                      # K and V of one token, one layer
    rows, width = off.rows, off.digests.width
    bounds = off.last_batch.bounds.shape[2] if off.last_batch is not None else 1
    digest_block = width * m.head_dim * 2 * off.digests.max.element_size()
    dense_kv = digests = selected = bookkeeping = 0
    for context in contexts:
        dense_kv += int(dense * context * token_kv)
        blocks = -(-int(context) // sparse.block_size)
        if blocks <= sparse.budget_blocks:
            dense_kv += int(layers * context * token_kv)
            continue
        chosen = sparse.budget_blocks
        per_row = (2 * 4 * bounds * blocks          # bounds: written by the score kernel, read by the select kernel
                   + 2 * blocks                     # the selection mask, read and written
                   + 8 * chosen * 3)                # the selection, its table and (offload) residency lookups
        if offload:
            per_row += 8 * blocks + 8 * 4 * sparse.budget_blocks   # residency row, host map reads, hot-set maps
        digests += layers * blocks * digest_block
        selected += layers * chosen * sparse.block_size * token_kv
        bookkeeping += layers * (rows * per_row + 4 * blocks)
    return SparseStepBytes(weights, dense_kv, digests, selected, bookkeeping)
