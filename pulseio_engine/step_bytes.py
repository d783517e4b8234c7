"""What one decode step must read from device memory: the numerator of every roofline here (the dense and the
sparse bench, the replay's rounds).

A dense step reads every weight once (the embedding as the B rows gathered, every other matrix in full) and
every cached K/V of the batch once, counted in tokens, not whole blocks. A sparse step reads the weights, the
dense layers' KV whole, and for each other layer and request either its whole KV (a request within the token
budget attends to all of it and selects nothing) or the selecting heads' digests of every block, the selected
blocks and the selection's and recall's bookkeeping.

The counts depend on a few numbers of the model and its sparse configuration (`StepShape`), taken from a built
engine (`StepShape.of`) or from the configs alone (`StepShape.for_model`, for a report of a model not built here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import GroupScore, ModelConfig, SparseConfig, SparseMode
from .preflight import weight_bytes

if TYPE_CHECKING:
    from .engine import Engine


@dataclass(frozen=True)
class SparseShape:
    """The sparse layers' part of `StepShape`."""

    dense_layers: int        # layers attended densely (their KV read whole)
    block_size: int
    budget_blocks: int       # blocks selected per request, layer and selecting row
    rows: int                # selecting rows per request: KV heads for Quest, 1 for SoloHead
    digest_block: int        # bytes of one block's digests (key max and min) of the selecting heads, one layer
    bounds: int              # bounds per row and block (1 summed over the group, G under max-norm)
    hot_blocks: int          # hot-set entries per request, layer and selecting row (offload requests)

    @classmethod
    def for_config(cls, config: SparseConfig, model: ModelConfig, dense_layers: int, digest_bytes: int,
                   hot_blocks: int | None = None) -> SparseShape:
        """As an engine with this sparse config lays its selection out: Quest selects per KV head, SoloHead with
        one head per layer. `hot_blocks` None: a hot set of one budget (`OffloadConfig.hot_blocks`)."""
        width = model.num_kv_heads if config.mode is SparseMode.QUEST else 1
        return cls(dense_layers, config.block_size, config.budget_blocks, width,
                   width * model.head_dim * 2 * digest_bytes, _bounds(config, model),
                   config.budget_blocks if hot_blocks is None else hot_blocks)


def _bounds(config: SparseConfig, model: ModelConfig) -> int:
    return 1 if config.group_score is GroupScore.SUM else model.num_heads // model.num_kv_heads


@dataclass(frozen=True)
class StepShape:
    """What a decode step's bytes depend on (see the module doc); `sparse` None: a dense engine."""

    weights: int             # every distinct weight tensor once
    embed_table: int         # an untied embedding table's bytes, read as the rows gathered (0: tied to lm_head)
    embed_row: int           # one row of it
    layers: int
    token_layer: int         # K and V of one token in one layer
    sparse: SparseShape | None

    @classmethod
    def of(cls, engine: Engine) -> StepShape:
        """The shape of `engine`'s steps: its weights as loaded, its KV dtype, its offloader's sparse config."""
        m, w = engine.config.model, engine.model.weights
        item = w.embed.element_size()
        off = engine.offloader
        sparse = None
        if off is not None:
            digest_block = off.digests.width * m.head_dim * 2 * off.digests.max.element_size()
            sparse = SparseShape(off.dense, off.sparse.block_size, off.sparse.budget_blocks, off.rows, digest_block,
                                 _bounds(off.sparse, m), off.offload.hot_blocks)
        return cls(w.parameter_bytes(), 0 if m.tie_word_embeddings else w.embed.numel() * item, m.hidden_size * item,
                   m.num_layers, 2 * m.num_kv_heads * m.head_dim * engine.kv.dtype.itemsize, sparse)

    @classmethod
    def for_model(cls, model: ModelConfig, *, dtype_bytes: int, sparse: SparseConfig | None = None,
                  dense_layers: int = 2, hot_blocks: int | None = None) -> StepShape:
        """The shape from the configs alone: weights as `preflight.weight_bytes` counts them (matrices and norms,
        no biases), KV and digests at `dtype_bytes`; `hot_blocks` as `SparseShape.for_config` takes it."""
        row = model.hidden_size * dtype_bytes
        return cls(weight_bytes(model, dtype_bytes), 0 if model.tie_word_embeddings else model.vocab_size * row, row,
                   model.num_layers, 2 * model.num_kv_heads * model.head_dim * dtype_bytes,
                   None if sparse is None else SparseShape.for_config(sparse, model, dense_layers, dtype_bytes,
                                                                      hot_blocks))

    def weight_bytes(self, batch_size: int) -> int:
        """The weights one step of `batch_size` requests reads (an untied embedding as its rows gathered)."""
        return self.weights - self.embed_table + (batch_size * self.embed_row if self.embed_table else 0)


@dataclass(frozen=True)
class StepBytes:
    """What one decode step must read from device memory, in bytes (its roofline's numerator)."""

    weights: int          # every weight once (the embedding's gathered rows)
    dense_kv: int         # KV read whole: a dense step's, the dense layers', every layer's of a request within
                          # the budget
    digests: int          # the selecting heads' key max and min, every block of every offloaded layer
    selected_kv: int      # the selected blocks' K and V, every offloaded layer and row
    bookkeeping: int      # bounds written and read, masks, block tables, residency and hot-set maps

    @property
    def total(self) -> int:
        return self.weights + self.dense_kv + self.digests + self.selected_kv + self.bookkeeping


def step_bytes(shape: StepShape, contexts: Sequence[float], *, offload: bool = False) -> StepBytes:
    """One step of requests of `contexts` tokens: dense (every layer's KV in `dense_kv`) where `shape` has no
    sparse part, else sparse; `offload`: the selected blocks come from hot sets (their maps are read too)."""
    weights, token_kv = shape.weight_bytes(len(contexts)), shape.token_layer
    s = shape.sparse
    if s is None:
        return StepBytes(weights, int(sum(contexts) * shape.layers * token_kv), 0, 0, 0)
    layers = shape.layers - s.dense_layers
    dense_kv = digests = selected = bookkeeping = 0
    for context in contexts:
        dense_kv += int(s.dense_layers * context * token_kv)
        blocks = -(-int(context) // s.block_size)
        if blocks <= s.budget_blocks:
            dense_kv += int(layers * context * token_kv)
            continue
        chosen = s.budget_blocks
        per_row = (2 * 4 * s.bounds * blocks        # bounds: written by the score kernel, read by the select kernel
                   + 2 * blocks                     # the selection mask, read and written
                   + 8 * chosen * 3)                # the selection, its table and (offload) residency lookups
        if offload:
            per_row += (8 * blocks                  # the residency row
                        + 8 * 2 * chosen            # host map reads, the selected entries' device slots
                        + (8 + 8 + 4 + 4) * s.hot_blocks)   # every hot-set entry's slot and owner, its age read and
                                                            # written (the least recently selected is evicted)
        digests += layers * blocks * s.digest_block
        selected += layers * chosen * s.block_size * token_kv
        bookkeeping += layers * (s.rows * per_row + 4 * blocks)
    return StepBytes(weights, dense_kv, digests, selected, bookkeeping)
