"""Accuracy of a sparse mode on long-context tasks: `pulseio-engine eval`.

Each sample is one request: its context is prefilled, its question is fed one token per decode step
(`decode_tail`, so the question goes through the sparse path as in Quest's evaluation), and the answer
is decoded greedily. Modes other than vanilla make the request an offload request: its KV in the host
pool, each decode step attending to `token_budget` tokens recalled through pulseio.
Perplexity: windows of `context_len - 1` tokens of a public-domain text (Shakespeare's plays); the last
quarter of each window (at most 256 tokens) is fed token by token and scored.

Samples run as concurrent requests of one engine (`run_prompts`, at most `batch` at once), and a
sample's result does not depend on the batch: each prompt is prefilled alone, in one chunk, exactly
as it would be on its own, so sharing a batch changes only which decode steps it shares, and decode
computes every row of a step independently (tested: batched and one-at-a-time outputs are equal).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from pulseio.machine import memory_budget

from ..config import (
    DEFAULT_GROUP_SCORE,
    CacheConfig,
    DType,
    EngineConfig,
    GroupScore,
    ModelConfig,
    OffloadConfig,
    RecallMode,
    SchedulerConfig,
    SparseConfig,
    SparseMode,
)
from ..engine import TORCH_DTYPES, Engine
from ..errors import EngineError
from ..fetch import MODELS, fetch_model, fetch_shakespeare
from ..kv.block_table import blocks_for
from ..kv.offload_layout import host_units_for
from ..kv.retrieval_heads import RetrievalHeads
from ..model.checkpoint import Checkpoint, load_checkpoint
from ..model.presets import PRESETS
from ..model.tokenizer import Tokenizer
from ..request import SamplingParams, Sequence
from .tasks import Task, make_sample, string_match_all

MAX_BATCH = 128     # concurrent requests at most, whatever the memory allows
_SLACK = 64         # positions past the context: the longest answer (30 tokens) and some room


class EvalMode(Enum):
    VANILLA = "vanilla"
    QUEST = "quest"
    SOLOHEAD = "solohead"
    SOLOHEAD_REVERSED = "solohead-reversed"

    @property
    def needs_heads(self) -> bool:
        return self in (EvalMode.SOLOHEAD, EvalMode.SOLOHEAD_REVERSED)


@dataclass(frozen=True)
class EvalConfig:
    task: Task
    context_len: int
    samples: int
    mode: EvalMode = EvalMode.QUEST
    token_budget: int = 2048
    recall: RecallMode = RecallMode.DOORBELL
    seed: int = 0
    group_score: GroupScore = DEFAULT_GROUP_SCORE

    def __post_init__(self) -> None:
        for name in ("context_len", "samples", "token_budget"):
            if getattr(self, name) < 1:
                raise EngineError(f"EvalConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.mode is not EvalMode.VANILLA:
            self.sparse   # noqa: B018 -- validates the budget before any model is loaded

    @property
    def sparse(self) -> SparseConfig:
        return SparseConfig(mode=SparseMode(self.mode.value), token_budget=self.token_budget,
                            group_score=self.group_score)


def record_group_score(record: dict[str, Any]) -> str | None:
    """The record's `GroupScore` value; None for vanilla. Records written before the rule was a setting
    have none: they used `sum`, the only rule then."""
    if record["mode"] == EvalMode.VANILLA.value:
        return None
    return record.get("group_score", GroupScore.SUM.value)


def mode_label(record: dict[str, Any]) -> str:
    """The record's mode as tables name it: `solohead`, or `solohead (max-norm)` under a non-default group rule."""
    rule = record_group_score(record)
    return record["mode"] if rule in (None, DEFAULT_GROUP_SCORE.value) else f"{record['mode']} ({rule})"


@dataclass(frozen=True)
class Prompt:
    """One sample as token ids: `ids[-tail:]` is fed one token per decode step, then up to
    `max_new_tokens` are generated. `answers` is empty for perplexity windows."""

    task: Task
    index: int
    ids: tuple[int, ...]
    tail: int
    max_new_tokens: int
    answers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Answer:
    output_ids: list[int]
    logprobs: list[float]      # of each tail token, given what precedes it


def check_heads(mode: EvalMode, heads: RetrievalHeads | None, model: str) -> None:
    if heads is None and mode.needs_heads:
        raise EngineError(f"mode {mode.value!r} needs the retrieval heads of this model; pass --heads "
                          f"heads.json (write it with `pulseio-engine calibrate --model {model} --out heads.json`)")


def run_eval(model: str, config: EvalConfig, *, heads: RetrievalHeads | None = None, device: str = "cpu",
             batch: int | None = None) -> dict[str, Any]:
    """-> the JSON record: task, mode, model, context_len, token_budget, samples, score, per-sample results.
    `batch`: concurrent requests at most (None: every sample, as memory allows)."""
    check_heads(config.mode, heads, model)
    ckpt = load_eval_checkpoint(model, device)
    tok = ckpt.tokenizer
    assert tok is not None                  # load_eval_checkpoint refuses a model without one
    prompts = make_prompts(tok, config.task, config.context_len, config.samples, config.seed)
    check_prompts(prompts, model_len(ckpt.config, config.context_len), model)
    start = time.monotonic()
    with eval_engine(ckpt, config, heads=heads, device=device, batch=batch or len(prompts)) as engine:
        answers = run_prompts(engine, prompts, offload=config.mode is not EvalMode.VANILLA)
        used = engine.config.scheduler.max_num_seqs
    return make_record(model, config, prompts, answers, tok, time.monotonic() - start, used)


def load_eval_checkpoint(model: str, device: str) -> Checkpoint:
    """The weights (fp32 on CPU, bf16 on CUDA) and tokenizer of a model name, .gguf or directory."""
    path = str(fetch_model(model)) if model in MODELS else model
    dtype = DType.FLOAT32 if device == "cpu" else DType.BFLOAT16
    ckpt = load_checkpoint(path, dtype=TORCH_DTYPES[dtype], device=device)
    if ckpt.tokenizer is None:
        raise EngineError(f"{model} has no tokenizer; evaluation needs text")
    return ckpt


def make_prompts(tok: Tokenizer, task: Task, context_len: int, samples: int, seed: int, *,
                 text: list[int] | None = None) -> list[Prompt]:
    """The samples of `task` at `context_len` as token ids (the same for every mode and budget).
    `text`: `text_ids(tok)`, when the caller already has it."""
    if task is Task.PERPLEXITY:
        return _windows(text if text is not None else text_ids(tok), context_len, samples)
    prompts = []
    for index in range(samples):
        sample = make_sample(task, context_len=context_len, seed=seed * 100_003 + index,
                             count_tokens=lambda text: len(tok.encode(text)))
        context, question = tok.encode(sample.context), tok.encode(sample.question)
        prompts.append(Prompt(task, index, tuple(context + question), len(question), sample.max_new_tokens,
                              sample.answers))
    return prompts


def text_ids(tok: Tokenizer) -> list[int]:
    """The perplexity text (Shakespeare's plays, public domain) in `tok`'s ids."""
    return tok.encode(Path(fetch_shakespeare()).read_text())


def windows_in(text_tokens: int, n: int) -> int:
    """Perplexity windows (`_windows`) a text of `text_tokens` tokens holds at context `n`: windows of
    n - 1 tokens whose scored tails do not overlap."""
    size = n - 1
    return 0 if text_tokens < size else (text_tokens - size) // _scored(n) + 1


def _scored(n: int) -> int:
    return min(256, n // 4)


def _windows(ids: list[int], n: int, samples: int) -> list[Prompt]:
    """`samples` windows of n - 1 tokens (the window and the token generated after it take n positions, so
    n may be the model's whole context); the last quarter (at most 256 tokens) is scored. The windows are
    disjoint where the text holds that many; otherwise their starts are spread evenly over the text, so
    their contexts overlap but no token is scored twice."""
    if samples > windows_in(len(ids), n):
        raise EngineError(f"{samples} windows of {n - 1} tokens with disjoint scored tails of {_scored(n)} need "
                          f"{n - 1 + (samples - 1) * _scored(n)} tokens of text, the text has {len(ids)}; ask for "
                          "fewer samples or a shorter context")
    size = n - 1
    stride = size if samples * size <= len(ids) else (len(ids) - size) // max(samples - 1, 1)
    return [Prompt(Task.PERPLEXITY, i, tuple(ids[i * stride:i * stride + size]), _scored(n), 1)
            for i in range(samples)]


def eval_engine(ckpt: Checkpoint, config: EvalConfig, *, heads: RetrievalHeads | None, device: str,
                batch: int) -> Engine:
    """An engine for at most `batch` concurrent requests of context_len + 64 tokens (fewer where memory
    is short: see `fitting_batch`), each prefilled in one chunk. No torch.compile: each configuration
    builds its own engine, and compiling would cost more than its few hundred decode steps save. CUDA
    graphs on a GPU: an eager offload step is host-bound (~80 launches per layer), and `run_prompts`
    keeps the batch whole so each engine captures once."""
    m, cache = ckpt.config, CacheConfig()
    blocks = blocks_for(config.context_len + _SLACK, cache.block_size)
    sparse = None if config.mode is EvalMode.VANILLA else config.sparse
    batch = min(batch, fitting_batch(m, config.context_len, sparse, device))
    offload = None
    if sparse is not None:
        offload = OffloadConfig(sparse=sparse, recall=config.recall, max_seqs=batch)
        units = host_units_for(m, offload, blocks * cache.block_size)
        offload = replace(offload, host_blocks=1 + batch * units)
    engine_config = EngineConfig(
        m, CacheConfig(num_blocks=1 + batch * blocks),
        SchedulerConfig(max_num_seqs=batch, max_prefill_tokens=blocks * cache.block_size), device=device,
        dtype=DType.FLOAT32 if device == "cpu" else DType.BFLOAT16,
        max_model_len=model_len(m, config.context_len), use_cuda_graphs=device.startswith("cuda"),
        compile_decode=False, offload=offload)
    return Engine(engine_config, ckpt.weights, tokenizer=ckpt.tokenizer, retrieval_heads=heads)


def model_len(m: ModelConfig, context_len: int) -> int:
    """Positions a request of an engine for `context_len` may reach: 64 past it, within the model's own."""
    return min(blocks_for(context_len + _SLACK, CacheConfig().block_size) * CacheConfig().block_size,
               m.max_position_embeddings)


def check_prompts(prompts: Seq[Prompt], limit: int, model: str) -> None:
    """Refuse, before any engine runs, a prompt whose answer would pass `limit` positions."""
    for p in prompts:
        if len(p.ids) + p.max_new_tokens > limit:
            raise EngineError(f"{p.task.value} sample {p.index}: {len(p.ids)} prompt tokens + {p.max_new_tokens} "
                              f"to generate exceed the {limit} positions {model} gets at this context length; "
                              "this is a bug in the task's sizing (evaluation/tasks.py)")


def fitting_batch(m: ModelConfig, context_len: int, sparse: SparseConfig | None, device: str) -> int:
    """Requests whose KV fits in half the free memory, at most MAX_BATCH: on the device the paged cache
    (every layer) and, when sparse, the hot slots; on the host the host pool (the same memory on CPU)."""
    elem = 4 if device == "cpu" else 2
    tokens = blocks_for(context_len + _SLACK, CacheConfig().block_size) * CacheConfig().block_size
    per_token = 2 * m.num_kv_heads * m.head_dim * elem            # K and V of one layer
    offloaded = m.num_layers - OffloadConfig().dense_layers
    on_device = m.num_layers * tokens * per_token + (offloaded * sparse.token_budget * per_token if sparse else 0)
    on_host = offloaded * tokens * per_token if sparse else 0
    if device == "cpu":
        needs = [(on_device + on_host, memory_budget("cpu"))]
    else:
        needs = [(on_device, memory_budget(device)), (on_host, memory_budget("cpu"))]
    fits = [b.nbytes // 2 // need for need, b in needs if need and b is not None]
    return max(1, min([MAX_BATCH, *fits]))


def run_prompts(engine: Engine, prompts: Seq[Prompt], *, offload: bool, lockstep: bool | None = None,
                seconds: dict[str, float] | None = None) -> list[Answer]:
    """Run `prompts` as concurrent requests (at most the engine's max_num_seqs at once), in order of
    admission; -> their answers, in prompt order. Each newly added request is prefilled before the next
    joins, so its prefill step holds it alone.

    With CUDA graphs (a GPU), the requests of one task run as a wave in lockstep: each decodes for
    the same number of steps (the task's longest question and answer; no further than the engine's
    positions allow), past its EOS and its own max_new_tokens, and its output is cut where it would
    have stopped. The decode batch then stays whole, so its graph (the offload step's pieces) is
    captured about once per wave, not once per finishing request; greedy rows are computed
    independently, so the answers are those of requests that stopped on their own.
    `lockstep`: force it on or off (default: on when the engine captures graphs). `seconds`, if given,
    gains the wall time of the steps that admitted a request ("prefill") and of the others ("decode")."""
    limit = engine.config.scheduler.max_num_seqs
    lockstep = engine.runner.graphs.use_graphs if lockstep is None else lockstep
    steps = {p.task: max(q.tail + q.max_new_tokens for q in prompts if q.task is p.task) for p in prompts}
    eos = engine.tokenizer.eos_token_ids if engine.tokenizer else engine.config.model.eos_token_ids
    pending = deque(enumerate(prompts))
    running: dict[int, tuple[int, Sequence]] = {}
    answers: list[Answer | None] = [None] * len(prompts)

    spent = {"prefill": 0.0, "decode": 0.0}

    def step(phase: str = "decode") -> None:
        start = time.perf_counter()
        outs = engine.step()
        spent[phase] += time.perf_counter() - start
        for out in outs:
            index, seq = running.pop(out.request_id)
            output = _as_if_stopped(list(out.output_ids), prompts[index].max_new_tokens, eos)
            answers[index] = Answer(output, list(seq.forced_logprobs))

    def joins(p: Prompt) -> bool:
        return len(running) < limit and (not lockstep or not running
                                         or prompts[next(iter(running.values()))[0]].task is p.task)

    while pending or running:
        while pending and joins(pending[0][1]):
            index, p = pending.popleft()
            sampling = SamplingParams(max_new_tokens=p.max_new_tokens)
            if lockstep:
                room = engine.config.model_len - len(p.ids)
                sampling = SamplingParams(max_new_tokens=min(steps[p.task] - p.tail, room), ignore_eos=True)
            rid = engine.add_request(p.ids, sampling, offload=offload, decode_tail=p.tail)
            seq = engine.scheduler.waiting[-1]
            running[rid] = (index, seq)
            while seq in engine.scheduler.waiting or seq.num_computed < seq.prefill_stop:
                step("prefill")
        step()
    if seconds is not None:
        for phase, value in spent.items():
            seconds[phase] = seconds.get(phase, 0.0) + value
    return answers   # type: ignore[return-value]


def _as_if_stopped(output: list[int], max_new_tokens: int, eos: Seq[int]) -> list[int]:
    """The tokens a request that stops at EOS or max_new_tokens would have produced."""
    output = output[:max_new_tokens]
    ends = [i for i, token in enumerate(output) if token in eos]
    return output[:ends[0] + 1] if ends else output


def score(prompts: Seq[Prompt], answers: Seq[Answer], tok: Tokenizer) -> tuple[float, list[dict[str, Any]]]:
    """-> (score, per-sample results): string_match_all averaged, or perplexity over every scored token."""
    results: list[dict[str, Any]]
    if prompts and prompts[0].task is Task.PERPLEXITY:
        results = [{"index": p.index, "scored_tokens": len(a.logprobs),
                    "perplexity": math.exp(-sum(a.logprobs) / len(a.logprobs))} for p, a in zip(prompts, answers)]
        nll = [-lp for a in answers for lp in a.logprobs]
        return math.exp(sum(nll) / len(nll)), results
    results = []
    for p, a in zip(prompts, answers):
        text = tok.decode(a.output_ids)
        results.append({"index": p.index, "prompt_tokens": len(p.ids), "answers": list(p.answers), "output": text,
                        "score": string_match_all(text, p.answers)})
    return sum(r["score"] for r in results) / len(results), results


def make_record(model: str, config: EvalConfig, prompts: Seq[Prompt], answers: Seq[Answer], tok: Tokenizer,
                seconds: float, batch: int) -> dict[str, Any]:
    value, results = score(prompts, answers, tok)
    record = {"task": config.task.value, "mode": config.mode.value, "recall": config.recall.value, "model": model,
              "context_len": config.context_len, "token_budget": config.token_budget, "samples": config.samples,
              "seed": config.seed, "score": value, "seconds": round(seconds, 3), "batch": batch, "results": results}
    if config.mode is not EvalMode.VANILLA:
        record["group_score"] = config.group_score.value
    if has_random_weights(model):
        record["random_weights"] = True     # a preset: the score measures nothing but the plumbing
    return record


def has_random_weights(model: str) -> bool:
    """A preset name (`tiny`, `qwen3-14b`, ...) builds random weights: its eval score is noise, not accuracy."""
    return model in PRESETS


def random_weights_note(model: str) -> str:
    return (f"note: {model} is a preset with RANDOM weights: its score is noise, not accuracy (fine to check the "
            "plumbing); for accuracy use a real model: --model smollm2, qwen2.5-coder-0.5b, a .gguf or a checkpoint "
            "folder")
