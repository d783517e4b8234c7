"""Paged decode attention: one query token per sequence against a block-paged KV cache.

`paged_decode_attention` runs a Triton flash-decoding (split-K) kernel on CUDA tensors and the
plain-torch reference on CPU; `paged_decode_attention_reference` is the fp32 reference itself.
`chunk_attention` is a prefill chunk's causal attention over its sequence's keys and values.
"""

from ._decode import paged_decode_attention as paged_decode_attention
from ._prefill import chunk_attention as chunk_attention
from ._reference import paged_decode_attention_reference as paged_decode_attention_reference

__all__ = ["chunk_attention", "paged_decode_attention", "paged_decode_attention_reference"]
