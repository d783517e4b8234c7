"""Layer-ahead speculative selection on a real model (CPU): how much of a decode step's recall a selection made one
layer early would have fetched in time.

Why: under IRQ the offload batch hides layer l's recall behind another batch's layers, so a round reads the weights
twice. A single batch could hide it behind its own layer l - 1 only if layer l's blocks were known a layer early.
This measures how well they can be: at each decode step and layer l (the model's own text, no generated loop, as
`pulseio-engine locality` decodes), with H the blocks the previous step selected at layer l (a hot set of one budget):

    T = layer l's selection from its own query (what the step attends to)
    P = the selection from the query layer l's weights make of the residual stream entering layer l - `--ahead`
        (known that many layers early: its recall could fly behind them); with `--previous-layer`, also
        (tallied as "previous-layer") the selection layer l - 1 made this step, which costs no extra work
    fetched  = |T - H| / K      what the step recalls today, all of it after layer l's query
    exposed  = |T - H - P| / K  what it would still recall after that query, with P prefetched
    prefetch = |P - H| / K      what the prefetch moves over the link (wasted where not in T)
    overlap  = |middle(T) & P| / |middle(T)|, the blocks outside sink and local windows

With `--overfetch F ...`, P is also selected at F times the budget (tallied as "<ahead>x<F>"): a prediction that
fetches more than the step will attend to, so that less is left for after the query, for more traffic.

The selection is the engine's (`block_scores`, `select_blocks`) over digests of the KV cache's keys, SoloHead through
the calibrated heads (`--heads`) or Quest per KV head. Usage (repo root, ~2 min a 4K window on 2 cores):

    python benchmarks/speculative_selection.py --model qwen2.5-coder-0.5b --heads HEADS.json --context-len 8192 \
        --steps 16 --samples 2 --token-budget 1024 --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run without PYTHONPATH too

from pulseio_engine.calibration import calibration_prompts
from pulseio_engine.config import (
    CacheConfig,
    DType,
    EngineConfig,
    GroupScore,
    SparseConfig,
    SparseMode,
    blocks_in_budgets,
)
from pulseio_engine.engine import Engine
from pulseio_engine.evaluation.locality import middle_overlap
from pulseio_engine.fetch import MODELS, fetch_model, fetch_shakespeare
from pulseio_engine.kv.block_table import blocks_for
from pulseio_engine.kv.retrieval_heads import RetrievalHeads
from pulseio_engine.kv.selection import block_scores, select_blocks
from pulseio_engine.model.batch_state import DecodeAttention
from pulseio_engine.model.checkpoint import load_checkpoint
from pulseio_engine.request import SamplingParams


@dataclass
class Tally:
    """Per layer: sums of |T - H|, |T - H - P|, |P - H|, kept and middle blocks, and selection slots."""

    fetched: list[int]
    exposed: list[int]
    prefetch: list[int]
    kept: list[int]
    middle: list[int]
    slots: list[int]

    @classmethod
    def zeros(cls, layers: int) -> Tally:
        return cls(*([0] * layers for _ in range(6)))

    def add(self, layer: int, true: torch.Tensor, held: torch.Tensor, pred: torch.Tensor,
            config: SparseConfig) -> None:
        """true, held, pred: [S, K] selections (T, H, P of the module doc; -1 padding)."""
        kept, middle = middle_overlap(pred, true, config)       # P's share of T's middle blocks
        self.kept[layer] += int(kept.sum())
        self.middle[layer] += int(middle.sum())
        for t, h, p in zip(true.tolist(), held.tolist(), pred.tolist(), strict=True):
            t, h, p = ({b for b in row if b >= 0} for row in (t, h, p))
            self.fetched[layer] += len(t - h)
            self.exposed[layer] += len(t - h - p)
            self.prefetch[layer] += len(p - h)
            self.slots[layer] += config.budget_blocks

    def per_layer(self, name: str) -> list[float]:
        num = getattr(self, name)
        den = self.middle if name == "kept" else self.slots
        return [round(a / max(b, 1), 4) for a, b in zip(num, den, strict=True)]

    def mean(self, name: str, layers: range) -> float:
        num, den = getattr(self, name), self.middle if name == "kept" else self.slots
        return round(sum(num[i] for i in layers) / max(sum(den[i] for i in layers), 1), 4)


class Recorder:
    """Wraps the model's `layer_begin`: for each decode step, the residual stream entering each layer, the layer's
    query, and the batch's KV cache and block table."""

    def __init__(self, model) -> None:  # noqa: ANN001
        self.model, self.begin = model, model.layer_begin
        self.streams: dict[int, torch.Tensor] = {}
        self.queries: dict[int, torch.Tensor] = {}
        self.state = None
        model.layer_begin = self.layer_begin

    def layer_begin(self, state, layer: int):  # noqa: ANN001, ANN202
        decode = isinstance(state.attention, DecodeAttention)
        if decode:
            self.streams[layer] = (state.hidden if state.delta is None else state.hidden + state.delta).clone()
        q, k, v = self.begin(state, layer)
        if decode:
            self.queries[layer], self.state = q.clone(), state
        return q, k, v

    def predicted_query(self, layer: int, ahead: int) -> torch.Tensor:
        """Layer `layer`'s query of the stream entering layer `layer - ahead` (the engine's
        `CausalLM.selection_query`, every head)."""
        return self.model.selection_query(self.streams[layer - ahead], self.state.positions, layer, None)

    def digests(self, layer: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (max, min [1, NB, Hkv, D] of the request's keys per block, num_tokens [1])."""
        st = self.state
        n = int(st.attention.context_lens[0])
        table = st.attention.block_tables[0, :blocks_for(n, block_size)].long()
        keys = st.kv.k(layer)[table].float()                         # [NB, block, Hkv, D]
        real = (torch.arange(keys.shape[0] * keys.shape[1]) < n).view(keys.shape[0], keys.shape[1], 1, 1)
        dmax = torch.where(real, keys, -torch.inf).amax(1)
        dmin = torch.where(real, keys, torch.inf).amin(1)
        return dmax[None], dmin[None], torch.tensor([n])


def _select(q: torch.Tensor, num_kv_heads: int, head: int | None,
            digests: tuple[torch.Tensor, torch.Tensor, torch.Tensor], sparse: SparseConfig) -> torch.Tensor:
    """The engine's selection of one request's blocks for query q [1, Hq, D] -> [S, K] block ids."""
    dmax, dmin, n = digests
    scores = block_scores(q, num_kv_heads, head, dmax, dmin, n, sparse.block_size, sparse.group_score)
    return select_blocks(scores, n, sparse)[0]


def measure(args: argparse.Namespace) -> dict:
    start = time.monotonic()
    ckpt = load_checkpoint(str(fetch_model(args.model)) if args.model in MODELS else args.model,
                           dtype=torch.float32, device="cpu")
    m = ckpt.config
    mode = SparseMode.QUEST if args.heads is None else SparseMode.SOLOHEAD
    sparse = SparseConfig(mode=mode, token_budget=args.token_budget, group_score=GroupScore(args.group_score))
    heads = None if args.heads is None else RetrievalHeads.load(Path(args.heads)).heads_for(mode)
    tokens = args.context_len + args.steps
    windows = calibration_prompts(ckpt.tokenizer.encode(fetch_shakespeare().read_text()), args.samples, tokens)
    cache = CacheConfig()
    blocks = blocks_for(tokens + 1, cache.block_size)
    engine = Engine(EngineConfig(m, CacheConfig(num_blocks=1 + blocks), device="cpu", dtype=DType.FLOAT32,
                                 max_model_len=min(blocks * cache.block_size, m.max_position_embeddings)),
                    ckpt.weights, tokenizer=ckpt.tokenizer)
    rec = Recorder(engine.model)
    first = max(args.dense_layers, *args.ahead)
    tallies: dict[int | str, Tally] = {}
    predictors: dict[int | str, tuple[int, SparseConfig]] = {}      # tally -> (layers ahead, the prediction's budget)
    for ahead in args.ahead:
        for factor in args.overfetch:
            name: int | str = ahead if factor == 1 else f"{ahead}x{factor:g}"
            tallies[name] = Tally.zeros(m.num_layers)
            blocks = blocks_in_budgets(factor, sparse.budget_blocks)          # as OffloadConfig.ahead_blocks
            predictors[name] = ahead, dataclasses.replace(sparse, token_budget=blocks * sparse.block_size)
    if args.previous_layer:
        tallies["previous-layer"] = Tally.zeros(m.num_layers)
    for w, window in enumerate(windows):
        engine.add_request(window, SamplingParams(max_new_tokens=1), decode_tail=args.steps)
        previous: dict[int, torch.Tensor] = {}                     # each layer's selection at the step before
        step = 0
        while engine.has_unfinished():
            rec.streams.clear()
            rec.queries.clear()
            engine.step()
            if not rec.queries:                                    # the prefill step
                continue
            this_step: dict[int, torch.Tensor] = {}
            for layer in range(first, m.num_layers):
                head = None if heads is None else heads[layer]
                digests = rec.digests(layer, cache.block_size)
                true = this_step[layer] = _select(rec.queries[layer], m.num_kv_heads, head, digests, sparse)
                if layer in previous:
                    for ahead, tally in tallies.items():
                        if ahead == "previous-layer":
                            if layer - 1 not in this_step:
                                continue
                            pred = this_step[layer - 1]
                        else:
                            layers_ahead, predicting = predictors[ahead]
                            pred = _select(rec.predicted_query(layer, layers_ahead), m.num_kv_heads, head, digests,
                                           predicting)
                        tally.add(layer, true, previous[layer], pred, sparse)
                previous[layer] = true
            step += 1
        print(f"window {w + 1}/{len(windows)}: {step} decode steps, {time.monotonic() - start:.0f} s", file=sys.stderr)
    layers = range(first, m.num_layers)
    return {"model": args.model, "mode": mode.value, "context_len": args.context_len, "steps": args.steps,
            "samples": args.samples, "token_budget": args.token_budget, "group_score": args.group_score,
            "overfetch": args.overfetch,
            "layers": list(layers), "seconds": round(time.monotonic() - start, 1),
            "ahead": {ahead: {**{f"mean_{name}": tally.mean(name, layers) for name in NAMES},
                              **{name: tally.per_layer(name)[first:] for name in NAMES}}
                      for ahead, tally in tallies.items()}}


NAMES = ("fetched", "exposed", "prefetch", "kept")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--heads", default=None, help="retrieval heads JSON (SoloHead); none: Quest per KV head")
    parser.add_argument("--context-len", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--token-budget", type=int, default=1024)
    parser.add_argument("--group-score", default="sum", choices=[g.value for g in GroupScore])
    parser.add_argument("--ahead", type=int, nargs="+", default=[1],
                        help="layers early the prediction is made, one tally each (default: 1)")
    parser.add_argument("--overfetch", type=float, nargs="+", default=[1.0],
                        help="the prediction's budget in budgets, one tally each (default: 1)")
    parser.add_argument("--previous-layer", action="store_true",
                        help="also tally the selection the layer before made this step, as the prediction")
    parser.add_argument("--dense-layers", type=int, default=2, help="layers that never select (default: 2)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    record = measure(args)
    print(json.dumps({k: v for k, v in record.items() if k not in ("layers", "ahead")}))
    for ahead, tally in record["ahead"].items():
        print(f"ahead {ahead}: " + ", ".join(f"{name} {tally['mean_' + name]}" for name in NAMES))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
