"""Memory preflight: before a model or a KV cache is built, estimate what the run needs and refuse,
with both numbers and a way out, when the device cannot hold it. Every subcommand calls `check_fits`.

The estimate (`MemoryNeed`) counts the weights at the run's dtype, the paged KV cache, and the
activations of the largest step (logits of the batch, one layer's MLP and attention workspace, the
prefill chunk), plus 10% for the allocator and the runtime. It is an estimate: a run that passes may
still be close to the edge, a run refused would not have fitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from pulseio.machine import MEMORY_LIMIT_ENV, MemoryBudget, gib, memory_budget

from .config import ModelConfig
from .errors import EngineError

_OVERHEAD = 1.10


class InsufficientMemoryError(EngineError, MemoryError):
    """A run needs more memory than its device has; raised before anything is allocated."""


@dataclass(frozen=True)
class MemoryNeed:
    """Bytes a run needs on its device, by part."""

    weights: int
    kv: int
    activations: int

    @property
    def total(self) -> int:
        return int((self.weights + self.kv + self.activations) * _OVERHEAD)

    def parts(self) -> str:
        return f"weights {gib(self.weights)}, KV {gib(self.kv)}, activations {gib(self.activations)}, +10%"


def weight_bytes(config: ModelConfig, dtype_bytes: int) -> int:
    """Every weight matrix and norm of `config` at `dtype_bytes` per value (a tied lm_head once)."""
    h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
    per_layer = (config.q_size + 2 * config.kv_size) * h + h * config.q_size + 3 * i * h + 2 * h
    per_layer += 2 * d if config.qk_norm else 0
    embed = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return (config.num_layers * per_layer + embed + h) * dtype_bytes


def estimate(config: ModelConfig, *, dtype_bytes: int, kv_tokens: int, batch: int,
             prefill_tokens: int) -> MemoryNeed:
    """`kv_tokens`: KV positions the cache holds (all sequences); `batch`: sequences decoded together;
    `prefill_tokens`: the largest prefill chunk."""
    kv = kv_tokens * config.num_layers * 2 * config.num_kv_heads * config.head_dim * dtype_bytes
    rows = max(batch, prefill_tokens)
    per_row = config.vocab_size + 2 * config.intermediate_size + config.q_size + 2 * config.kv_size
    act = rows * per_row * 4 + batch * config.vocab_size * 4   # fp32 logits, and their sampled copy
    return MemoryNeed(weight_bytes(config, dtype_bytes), kv, act)


def fixes_for(spec: str, device: str, *smaller: str) -> str:
    """What a user can change: a smaller model, the run-specific `smaller` options, a GPU."""
    fixes = [f"use a smaller --model than {spec} (tiny, smollm2)", *smaller]
    if device == "cpu":
        fixes.append("or --device cuda on a machine with a GPU")
    return ", ".join(fixes)


def check_fits(need: MemoryNeed, *, device: str, what: str, fixes: str,
               budget: MemoryBudget | None = None) -> None:
    """Raise InsufficientMemoryError if `need` exceeds `device`'s budget (see pulseio.machine).
    `what` names the run ("qwen3-14b, batch 64 x 4096 tokens"); `fixes` says what to change."""
    budget = budget or memory_budget(device)
    if budget is None or need.total <= budget.nbytes:
        return
    raise InsufficientMemoryError(
        f"{what} needs about {gib(need.total)} on {device} ({need.parts()}), more than the "
        f"{gib(budget.nbytes)} it has ({budget.source}); {fixes} (the limit can be lowered, never raised, "
        f"with {MEMORY_LIMIT_ENV})"
    )
