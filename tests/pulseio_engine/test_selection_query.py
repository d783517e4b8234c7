"""`CausalLM.selection_query`: a layer's queries of a residual stream from that layer's q rows alone. Fed the
stream entering the layer itself, it gives the layer's own queries (every head, or one KV head's group), for each
architecture (Qwen3's q norm, Qwen2's q bias, Llama)."""

from __future__ import annotations

import torch

from pulseio_engine.kv.cache import KVCache
from pulseio_engine.model.batch_state import DecodeAttention
from pulseio_engine.model.checkpoint import load_checkpoint
from pulseio_engine.model.llama import CausalLM


def test_a_layers_query_of_its_own_stream_is_its_own_q(tiny_hf) -> None:
    ckpt = load_checkpoint(str(tiny_hf[0]), dtype=torch.float32, device="cpu", with_tokenizer=False)
    cfg = ckpt.config
    model = CausalLM(cfg, ckpt.weights, max_len=256)
    kv = KVCache(num_layers=cfg.num_layers, num_blocks=8, block_size=16, num_kv_heads=cfg.num_kv_heads,
                 head_dim=cfg.head_dim, dtype=torch.float32, device="cpu")
    b = 3
    positions = torch.tensor([5, 40, 77])
    tables = torch.arange(8, dtype=torch.int32).view(1, 8).repeat(b, 1)
    state = model.begin(torch.tensor([3, 9, 11]), positions, positions % 16 + 16 * (positions // 16),
                        DecodeAttention(tables, (positions + 1).to(torch.int32)), kv)
    group = cfg.num_heads // cfg.num_kv_heads
    for layer in range(cfg.num_layers):
        q, _, _ = model.layer_begin(state, layer)
        stream = state.hidden                                  # the residual stream entering `layer`
        torch.testing.assert_close(model.selection_query(stream, positions, layer, None), q, rtol=1e-5, atol=1e-6)
        for head in range(cfg.num_kv_heads):
            torch.testing.assert_close(model.selection_query(stream, positions, layer, head),
                                       q[:, head * group:(head + 1) * group], rtol=1e-5, atol=1e-6)
        if layer + 1 < cfg.num_layers:                         # another layer's weights make other queries
            assert not torch.allclose(model.selection_query(stream, positions, layer + 1, None), q, atol=1e-3)
        attn = torch.zeros_like(q)
        model.layer_end(state, layer, attn)
