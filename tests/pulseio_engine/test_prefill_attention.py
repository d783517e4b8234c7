"""Prefill attention (`chunk_attention`): what a plain softmax over the causal scores gives, through SDPA's
fused kernel (3-D inputs would send SDPA to its math kernel, which materializes every score)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from pulseio_engine.attention import chunk_attention


def _plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos_start: int, scale: float) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,chd->hnc", q, k) * scale                       # [Hq, n, ctx]
    rows = torch.arange(q.shape[0])[:, None] + pos_start
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > rows, float("-inf"))
    return torch.einsum("hnc,chd->nhd", scores.softmax(-1), v)


@pytest.mark.parametrize("pos_start", [0, 40], ids=["first-chunk", "later-chunk"])
def test_chunk_attention_runs_on_the_fused_kernel_and_equals_plain_softmax(pos_start: int) -> None:
    torch.manual_seed(pos_start)
    n, hq, hkv, d = 48, 6, 2, 32
    q, k, v = torch.randn(n, hq, d), torch.randn(pos_start + n, hkv, d), torch.randn(pos_start + n, hkv, d)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):          # no math fallback: 3-D inputs raise here
        out = chunk_attention(q, k, v, pos_start, 0.2)
    torch.testing.assert_close(out, _plain(q, k, v, pos_start, 0.2), rtol=1e-5, atol=1e-5)
