"""Paged decode attention: one query token per sequence against a block-paged KV cache.

`paged_decode_attention` runs a Triton flash-decoding (split-K) kernel on CUDA tensors and the
plain-torch reference on CPU; `paged_decode_attention_reference` is the fp32 reference itself.
`decode_partials` / `attend_part` / `attend_last_part` compute it over several tables one at a time (an
offloaded layer's resident blocks while its recall is in flight, then the recalled ones, merged as they run).
`chunk_attention` is a prefill chunk's causal attention over its sequence's keys and values.
"""

from ._decode import paged_decode_attention as paged_decode_attention
from ._partials import DecodePartials as DecodePartials
from ._partials import attend_last_part as attend_last_part
from ._partials import attend_part as attend_part
from ._partials import decode_partials as decode_partials
from ._prefill import chunk_attention as chunk_attention
from ._reference import paged_decode_attention_reference as paged_decode_attention_reference

__all__ = ["DecodePartials", "attend_last_part", "attend_part", "chunk_attention", "decode_partials",
           "paged_decode_attention", "paged_decode_attention_reference"]
