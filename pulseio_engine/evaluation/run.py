"""Accuracy of a sparse mode on long-context tasks: `pulseio-engine eval`.

Each sample runs as one request: its context is prefilled, its question is fed one token per decode
step (`decode_tail`, so the question goes through the sparse path as in Quest's evaluation), and the
answer is decoded greedily. Modes other than vanilla make the request an offload request: its KV in
the host pool, each decode step attending to `token_budget` tokens recalled through pulseio.
Perplexity: windows of `context_len` tokens of a public-domain text (Shakespeare's plays); the last
quarter of each window (at most 256 tokens) is fed token by token and scored.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from ..config import CacheConfig, DType, EngineConfig, OffloadConfig, RecallMode, SparseConfig, SparseMode
from ..engine import TORCH_DTYPES, Engine
from ..errors import EngineError
from ..fetch import MODELS, fetch_model, fetch_shakespeare
from ..kv.block_table import blocks_for
from ..kv.retrieval_heads import RetrievalHeads
from ..model.checkpoint import load_checkpoint
from ..request import SamplingParams
from .tasks import Task, make_sample, string_match_all


class EvalMode(Enum):
    VANILLA = "vanilla"
    QUEST = "quest"
    SOLOHEAD = "solohead"
    SOLOHEAD_REVERSED = "solohead-reversed"


@dataclass(frozen=True)
class EvalConfig:
    task: Task
    context_len: int
    samples: int
    mode: EvalMode = EvalMode.QUEST
    token_budget: int = 2048
    recall: RecallMode = RecallMode.DOORBELL
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("context_len", "samples", "token_budget"):
            if getattr(self, name) < 1:
                raise EngineError(f"EvalConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.mode is not EvalMode.VANILLA:
            self.sparse   # noqa: B018 -- validates the budget before any model is loaded

    @property
    def sparse(self) -> SparseConfig:
        return SparseConfig(mode=SparseMode(self.mode.value), token_budget=self.token_budget)


def run_eval(model: str, config: EvalConfig, *, heads: RetrievalHeads | None = None,
             device: str = "cpu") -> dict[str, Any]:
    """-> the JSON record: task, mode, model, context_len, token_budget, samples, score, per-sample results."""
    if heads is None and config.mode in (EvalMode.SOLOHEAD, EvalMode.SOLOHEAD_REVERSED):
        raise EngineError(f"mode {config.mode.value!r} needs the retrieval heads of this model; pass --heads "
                          f"heads.json (write it with `pulseio-engine calibrate --model {model} --out heads.json`)")
    path = str(fetch_model(model)) if model in MODELS else model
    start = time.monotonic()
    with _engine(path, config, heads, device) as engine:
        if engine.tokenizer is None:
            raise EngineError(f"{model} has no tokenizer; evaluation needs text")
        results = (_perplexity(engine, config) if config.task is Task.PERPLEXITY
                   else [_answer(engine, config, i) for i in range(config.samples)])
    if config.task is Task.PERPLEXITY:
        nll = [-lp for r in results for lp in r.pop("logprobs")]
        score = math.exp(sum(nll) / len(nll))
    else:
        score = sum(r["score"] for r in results) / len(results)
    return {"task": config.task.value, "mode": config.mode.value, "recall": config.recall.value, "model": model,
            "context_len": config.context_len, "token_budget": config.token_budget, "samples": config.samples,
            "score": score, "seconds": round(time.monotonic() - start, 3), "results": results}


def _engine(path: str, config: EvalConfig, heads: RetrievalHeads | None, device: str) -> Engine:
    """One engine sized for one request of context_len + 64 tokens."""
    dtype = DType.FLOAT32 if device == "cpu" else DType.BFLOAT16
    ckpt = load_checkpoint(path, dtype=TORCH_DTYPES[dtype], device=device)
    m, cache = ckpt.config, CacheConfig()
    blocks = blocks_for(config.context_len + 64, cache.block_size)
    offload = None
    if config.mode is not EvalMode.VANILLA:
        sparse = config.sparse
        units = (m.num_layers - OffloadConfig().dense_layers) * m.num_kv_heads * blocks   # head-wise: the most
        offload = OffloadConfig(sparse=sparse, recall=config.recall, max_seqs=1, host_blocks=1 + units)
    engine_config = EngineConfig(m, replace(cache, num_blocks=1 + blocks), device=device, dtype=dtype,
                                 max_model_len=min(blocks * cache.block_size, m.max_position_embeddings),
                                 offload=offload)
    return Engine(engine_config, ckpt.weights, tokenizer=ckpt.tokenizer, retrieval_heads=heads)


def _run_one(engine: Engine, prompt: list[int], tail: int, max_new_tokens: int, offload: bool
             ) -> tuple[list[int], list[float]]:
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=max_new_tokens), offload=offload,
                             decode_tail=tail)
    seq = engine.scheduler.waiting[-1]
    outputs: dict[int, list[int]] = {}
    while engine.has_unfinished():
        outputs.update((o.request_id, list(o.output_ids)) for o in engine.step())
    return outputs[rid], seq.forced_logprobs


def _answer(engine: Engine, config: EvalConfig, index: int) -> dict[str, Any]:
    tok = engine.tokenizer
    sample = make_sample(config.task, context_len=config.context_len, seed=config.seed * 100_003 + index,
                         count_tokens=lambda text: len(tok.encode(text)))
    context, question = tok.encode(sample.context), tok.encode(sample.question)
    output, _ = _run_one(engine, context + question, len(question), sample.max_new_tokens,
                         config.mode is not EvalMode.VANILLA)
    text = tok.decode(output)
    return {"index": index, "prompt_tokens": len(context) + len(question), "answers": list(sample.answers),
            "output": text, "score": string_match_all(text, sample.answers)}


def _perplexity(engine: Engine, config: EvalConfig) -> list[dict[str, Any]]:
    ids = engine.tokenizer.encode(Path(fetch_shakespeare()).read_text())
    n, tail = config.context_len, min(256, config.context_len // 4)
    if config.samples * n > len(ids):
        raise EngineError(f"{config.samples} windows of {n} tokens need {config.samples * n} tokens of text, "
                          f"the text has {len(ids)}; ask for fewer samples or a shorter context")
    results = []
    for index in range(config.samples):
        window = ids[index * n:(index + 1) * n]
        _, logprobs = _run_one(engine, window, tail, 1, config.mode is not EvalMode.VANILLA)
        results.append({"index": index, "scored_tokens": len(logprobs),
                        "perplexity": math.exp(-sum(logprobs) / len(logprobs)), "logprobs": logprobs})
    return results
