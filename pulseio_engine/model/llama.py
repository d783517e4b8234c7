"""The Llama / Qwen2 / Qwen3 decoder, as per-layer steps over a `BatchState`.

    state = model.begin(...)                 # embed
    for layer in range(num_layers):
        model.layer_step(state, layer)       # may pause here and run another batch's layers
    logits = model.end(state)                # final norm + lm_head

The model owns no per-batch state: each batch carries its hidden states, positions, slots,
attention metadata, KV cache and next layer, so two batches interleave layer by layer freely.
Qwen2 differs from Llama only by biases on the q, k and v projections, Qwen3 only by the
per-head RMSNorm on q and k before RoPE.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..attention import chunk_attention, paged_decode_attention
from ..config import ModelConfig
from ..kv.cache import KVCache
from .batch_state import BatchState, DecodeAttention, PrefillAttention
from .layers import Rotary, final_norm, post_attention, pre_attention, select_query
from .linear import decode_workspace, linear
from .params import ModelWeights


class CausalLM:
    def __init__(self, config: ModelConfig, weights: ModelWeights, *, max_len: int,
                 compile_decode: bool = False, skinny_gemm: bool = True) -> None:
        """`compile_decode`: run decode batches' pre/post-attention halves through `torch.compile`.
        `skinny_gemm`: projections of at most 32 rows through `skinny_linear` where it runs (a GPU, bf16 / fp16;
        see `linear`), else all through F.linear."""
        weights.check(config)
        self.config = config
        self.weights = weights
        self.rotary = Rotary(config, max_len, weights.embed.dtype, weights.embed.device)
        self.scale = config.head_dim ** -0.5
        self.compile_error: str | None = None
        self.workspace = decode_workspace(config, self.device, self.dtype) if skinny_gemm else None
        self._decode_halves: tuple[Callable, Callable] = (pre_attention, post_attention)
        self._select_query: Callable = select_query
        if compile_decode:
            self._decode_halves = (torch.compile(pre_attention, fullgraph=True),
                                   torch.compile(post_attention, fullgraph=True))
            self._select_query = torch.compile(select_query, fullgraph=True)

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    @property
    def compiled(self) -> bool:
        return self._decode_halves[0] is not pre_attention

    def disable_compile(self, reason: str) -> None:
        """Fall back to eager decode halves (e.g. the compiler toolchain failed); keeps the reason."""
        self._decode_halves = (pre_attention, post_attention)
        self._select_query = select_query
        self.compile_error = reason

    def begin(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
              attention: DecodeAttention | PrefillAttention, kv: KVCache,
              logit_rows: torch.Tensor | None = None) -> BatchState:
        """input_ids, positions, slots: [T] int64 on the model's device; slot = block * block_size + offset."""
        hidden = F.embedding(input_ids, self.weights.embed)    # [T, H]
        # a zero delta, not None: the compiled first half then takes one signature at every layer (Dynamo
        # compiles a function once per argument kind), and x + 0 is x
        return BatchState(hidden, positions, kv.rows(slots), attention, kv, logit_rows, delta=torch.zeros_like(hidden))

    def layer_step(self, state: BatchState, layer_idx: int) -> None:
        """Run decoder layer `layer_idx` on the batch, in place; layers must run in order."""
        q, k, v = self.layer_begin(state, layer_idx)
        if state.sparse is not None and state.sparse.covers(layer_idx):
            attn = state.sparse.attend(layer_idx, q, k, v)           # offloaded layer: KV kept by `sparse`
        elif isinstance(state.attention, DecodeAttention):
            state.kv.write(layer_idx, k, v, state.kv_rows)
            meta = state.attention
            attn = paged_decode_attention(q, state.kv.k(layer_idx), state.kv.v(layer_idx), meta.block_tables,
                                          meta.context_lens, self.scale)
        else:
            state.kv.write(layer_idx, k, v, state.kv_rows)
            attn = self._prefill_attention(q, state.kv, layer_idx, state.attention)
        self.layer_end(state, layer_idx, attn)

    def layer_begin(self, state: BatchState, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer `layer_idx` up to its attention: -> q [T, Hq, D], k, v [T, Hkv, D] (normed, rotated).
        A caller that attends itself (the offload step's graph pieces) finishes with `layer_end`."""
        if layer_idx != state.next_layer:
            raise ValueError(f"batch is at layer {state.next_layer}, cannot run layer {layer_idx}")
        cfg, w = self.config, self.weights.layers[layer_idx]
        pre = self._decode_halves[0] if isinstance(state.attention, DecodeAttention) else pre_attention
        state.hidden, q, k, v = pre(state.hidden, state.delta, state.positions, self.rotary.cos, self.rotary.sin,
                                    w.input_norm, w.qkv, w.qkv_bias, w.q_norm, w.k_norm, cfg.rms_norm_eps,
                                    cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, self.workspace)
        state.delta = None
        return q, k, v

    def layer_end(self, state: BatchState, layer_idx: int, attn: torch.Tensor) -> None:
        """Layer `layer_idx` after its attention ([T, Hq, D]): output projection and MLP, in place."""
        cfg, w = self.config, self.weights.layers[layer_idx]
        post = self._decode_halves[1] if isinstance(state.attention, DecodeAttention) else post_attention
        state.hidden, state.delta = post(state.hidden, attn, w.o, w.post_norm, w.gate_up, w.down, cfg.rms_norm_eps,
                                         self.workspace)
        state.next_layer += 1

    def selection_query(self, x: torch.Tensor, positions: torch.Tensor, layer_idx: int,
                        kv_head: int | None) -> torch.Tensor:
        """The queries layer `layer_idx` would make of residual stream x ([T, H], e.g. `state.hidden` after an
        earlier layer's `layer_begin`) at these positions ([T]): of KV head `kv_head`'s query group -> [T, G, D],
        or of every head (None) -> [T, Hq, D]. Reads only those heads' rows of the layer's qkv weight; compiled as
        the decode halves are. Its projection takes no share of the decode workspace, whose split-K counters allow
        one call at a time: a captured step runs it on a branch beside the layer's own projections
        (`OffloadStepGraph._prefetch`)."""
        cfg, w = self.config, self.weights.layers[layer_idx]
        group = cfg.num_heads // cfg.num_kv_heads
        first, heads = (0, cfg.num_heads) if kv_head is None else (kv_head * group, group)
        rows = slice(first * cfg.head_dim, (first + heads) * cfg.head_dim)
        return self._select_query(x, positions, self.rotary.cos, self.rotary.sin, w.input_norm, w.qkv[rows],
                                  None if w.qkv_bias is None else w.qkv_bias[rows], w.q_norm, cfg.rms_norm_eps,
                                  cfg.head_dim)

    def end(self, state: BatchState) -> torch.Tensor:
        """-> logits [S, V] fp32 for `state.logit_rows` (all rows when None)."""
        if state.next_layer != self.config.num_layers:
            raise ValueError(f"batch is at layer {state.next_layer} of {self.config.num_layers}; "
                             "run every layer before end()")
        x, delta, rows = state.hidden, state.delta, state.logit_rows
        if rows is not None:
            x, delta = x[rows], None if delta is None else delta[rows]
        x = final_norm(x, delta, self.weights.norm, self.config.rms_norm_eps)
        return linear(x, self.weights.lm_head, workspace=self.workspace).float()

    def forward(self, state: BatchState) -> torch.Tensor:
        """Run the remaining layers and return logits [S, V] fp32."""
        for layer in range(state.next_layer, self.config.num_layers):
            self.layer_step(state, layer)
        return self.end(state)

    def _prefill_attention(self, q: torch.Tensor, kv: KVCache, layer: int,
                           meta: PrefillAttention) -> torch.Tensor:
        """q: [T, Hq, D] -> [T, Hq, D]: each span attends causally to its sequence's cached KV."""
        out = torch.empty_like(q)
        for span in meta.spans:
            rows = slice(span.row_start, span.row_start + span.length)
            k, v = kv.gather(layer, span.block_ids, span.pos_start + span.length)    # [ctx, Hkv, D]
            out[rows] = chunk_attention(q[rows], k, v, span.pos_start, self.scale)
        return out
