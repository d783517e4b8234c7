"""The engine's recall ahead on a real model (CPU): what an offload request's decode steps recall after each layer's
own query, with and without `OffloadConfig.ahead`, and what the prefetch moves.

`speculative_selection.py` measures the prediction outside the engine; this runs it inside: an offload request
(SoloHead through the calibrated heads, or Quest) is prefilled with a window of Shakespeare, then fed its next
`--steps` tokens one per decode step, once without `ahead` and once with it for each `--ahead-budget` (the
prediction's own budget, `OffloadConfig.ahead_budget`), hot sets of `--hot-cache` budgets in every run.
Per step and offloaded layer, in units of the budget (K blocks a selecting row):

    recalled  what the step recalls without `ahead` (all of it after each layer's query)
    exposed   with `ahead`, what it still recalls after the query (its total less what was recalled ahead)
    ahead     with `ahead`, what the prefetch moved (a layer early)

and whether the runs agree (they must: the selection is the layer's own either way; only where each block's
attention is summed moves, resident or recalled, so the logits agree to rounding and the greedy tokens exactly). The
first decode step, which fills the hot sets, is left out of the counts. Usage (repo root, ~3 min a 4K window on 2
cores):

    python benchmarks/recall_ahead.py --model qwen2.5-coder-0.5b --heads HEADS.json --context-len 4096 \
        --steps 16 --token-budget 1024 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run without PYTHONPATH too

from pulseio_engine.calibration import calibration_prompts  # noqa: E402
from pulseio_engine.config import (  # noqa: E402
    CacheConfig,
    DType,
    EngineConfig,
    OffloadConfig,
    SparseConfig,
    SparseMode,
)
from pulseio_engine.engine import Engine  # noqa: E402
from pulseio_engine.fetch import MODELS, fetch_model, fetch_shakespeare  # noqa: E402
from pulseio_engine.kv.block_table import blocks_for  # noqa: E402
from pulseio_engine.kv.retrieval_heads import RetrievalHeads  # noqa: E402
from pulseio_engine.model.checkpoint import Checkpoint, load_checkpoint  # noqa: E402
from pulseio_engine.request import SamplingParams  # noqa: E402


def run(args: argparse.Namespace, ckpt: Checkpoint, ahead: float | None, window: list[int]) -> dict:
    """One decode of `window` as an offload request, recalled ahead at a prediction of `ahead` budgets (None: not
    ahead) -> its per-step bytes and logits."""
    m = ckpt.config
    mode = SparseMode.QUEST if args.heads is None else SparseMode.SOLOHEAD
    heads = None if args.heads is None else RetrievalHeads.load(Path(args.heads))
    cache = CacheConfig()
    blocks = blocks_for(len(window) + 1, cache.block_size)
    offload = OffloadConfig(sparse=SparseConfig(mode=mode, token_budget=args.token_budget), max_seqs=1,
                            host_blocks=m.num_layers * blocks * m.num_kv_heads, dense_layers=args.dense_layers,
                            hot_cache=args.hot_cache, ahead=ahead is not None, ahead_budget=ahead or 1.0)
    config = EngineConfig(m, CacheConfig(num_blocks=1 + blocks), device="cpu", dtype=DType.FLOAT32,
                          max_model_len=min(blocks * cache.block_size, m.max_position_embeddings), offload=offload)
    engine = Engine(config, ckpt.weights, tokenizer=ckpt.tokenizer, retrieval_heads=heads)
    engine.add_request(window, SamplingParams(max_new_tokens=1), offload=True, decode_tail=args.steps)
    off = engine.offloader
    assert off is not None
    steps, logits = [], []
    while engine.has_unfinished():
        before = off.statistics()
        engine.step()
        after = off.statistics()
        if off.last_batch is None or after.recalls == before.recalls:          # the prefill
            continue
        logits.append(engine.runner.offload_step_graph.logits[0].clone())      # type: ignore[union-attr]
        steps.append((after.bytes_recalled - before.bytes_recalled, after.bytes_ahead - before.bytes_ahead))
    per_step = off.layout.unit_bytes * off.rows * off.sparse.budget_blocks * (m.num_layers - args.dense_layers)
    counted = steps[1:]                                                       # the first fills the hot sets
    total = sum(t for t, _ in counted) / per_step / len(counted)
    early = sum(a for _, a in counted) / per_step / len(counted)
    return {"total": round(total, 4), "ahead": round(early, 4), "exposed": round(total - early, 4),
            "logits": torch.stack(logits)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="a preset or a checkpoint directory")
    parser.add_argument("--heads", default=None, help="retrieval heads (JSON) for SoloHead; none: Quest")
    parser.add_argument("--context-len", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=16, help="decode steps after the prompt")
    parser.add_argument("--token-budget", type=int, default=1024)
    parser.add_argument("--dense-layers", type=int, default=2)
    parser.add_argument("--hot-cache", type=float, default=1.5, help="hot sets in budgets, both runs (> 1)")
    parser.add_argument("--ahead-budget", type=float, nargs="+", default=[1.0],
                        help="the prediction's budget(s), in budgets (OffloadConfig.ahead_budget): one run with ahead "
                             "each, against the one run without")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    start = time.monotonic()
    ckpt = load_checkpoint(str(fetch_model(args.model)) if args.model in MODELS else args.model,
                           dtype=torch.float32, device="cpu")
    assert ckpt.tokenizer is not None
    window = calibration_prompts(ckpt.tokenizer.encode(fetch_shakespeare().read_text()), 1,
                                 args.context_len + args.steps)[0]
    without = run(args, ckpt, None, window)
    a = without.pop("logits")
    rows, same = [], True
    for budget in args.ahead_budget:
        with_ahead = run(args, ckpt, budget, window)
        b = with_ahead.pop("logits")
        diff = float((a - b).abs().max() / a.abs().max())
        equal = bool(torch.equal(a.argmax(-1), b.argmax(-1))) and diff < 1e-4
        same = same and equal
        rows.append({"ahead_budget": budget, "exposed": with_ahead["exposed"], "ahead": with_ahead["ahead"],
                     "exposed_share": round(with_ahead["exposed"] / without["total"], 3),
                     "traffic": round(with_ahead["total"] / without["total"], 3), "greedy_equal": equal,
                     "logits_max_diff": diff})
    out = {"model": args.model, "mode": "quest" if args.heads is None else "solohead",
           "context_len": args.context_len, "steps": args.steps, "token_budget": args.token_budget,
           "hot_cache": args.hot_cache, "recalled": without["total"],
           **(rows[0] if len(rows) == 1 else {"by_ahead_budget": rows}),
           "seconds": round(time.monotonic() - start, 1)}
    print(json.dumps(out))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
