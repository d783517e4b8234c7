"""Next-token choice from logits: greedy (temperature 0) or temperature sampling."""

from __future__ import annotations

import torch


def sample_tokens(logits: torch.Tensor, temperatures: list[float],
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """logits: [S, V] fp32; temperatures: S floats (0 = greedy) -> [S] int64, same device."""
    greedy = logits.argmax(dim=-1)
    if not any(t > 0 for t in temperatures):
        return greedy
    temps = torch.tensor(temperatures, dtype=torch.float32, device=logits.device)
    probs = torch.softmax(logits / temps.clamp_min(1e-6)[:, None], dim=-1)
    sampled = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return torch.where(temps > 0, sampled, greedy)
