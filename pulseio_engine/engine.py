"""Engine: the composition root. Owns the scheduler (host bookkeeping) and the runner (device work).

    engine = Engine.from_model("tiny")
    rid = engine.add_request(engine.tokenizer.encode("Hello"), SamplingParams(max_new_tokens=16))
    while engine.has_unfinished():
        for out in engine.step(): ...

Requests join (`add_request`) and leave (finish) between steps: continuous batching.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from itertools import count

import torch

from .config import CacheConfig, DType, EngineConfig, SchedulerConfig
from .errors import PromptTooLongError
from .kv.block_table import BlockAllocator, blocks_for
from .kv.cache import KVCache, kv_bytes_per_token
from .kv.handoff import KVSource
from .model.checkpoint import ModelSource, load_checkpoint
from .model.llama import CausalLM
from .model.params import ModelWeights
from .model.tokenizer import Tokenizer
from .request import RequestOutput, SamplingParams, Sequence
from .runner import ModelRunner
from .scheduler import ScheduledStep, Scheduler

TORCH_DTYPES = {DType.FLOAT32: torch.float32, DType.BFLOAT16: torch.bfloat16, DType.FLOAT16: torch.float16}


@dataclass(frozen=True)
class EngineStatistics:
    """Counters of an Engine (a snapshot)."""

    num_waiting: int
    num_running: int
    num_free_blocks: int
    num_blocks: int
    steps: int
    prefill_tokens: int
    decode_tokens: int


class Engine:
    """Continuous-batching decode engine over one model and one paged KV cache."""

    def __init__(self, config: EngineConfig, weights: ModelWeights, *, tokenizer: Tokenizer | None = None,
                 seed: int = 0) -> None:
        self.config = config
        self.tokenizer = tokenizer
        dtype = TORCH_DTYPES[config.dtype]
        self.model = CausalLM(config.model, weights, max_len=config.model_len, compile_decode=config.compile)
        num_blocks = config.cache.num_blocks or _default_num_blocks(config, dtype)
        m = config.model
        self.kv = KVCache(num_layers=m.num_layers, num_blocks=num_blocks, block_size=config.cache.block_size,
                          num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, dtype=dtype, device=config.device)
        self.scheduler = Scheduler(config.scheduler, BlockAllocator(num_blocks), config.cache.block_size)
        self.runner = ModelRunner(self.model, self.kv, max_batch=config.scheduler.max_num_seqs,
                                  max_model_len=config.model_len, use_cuda_graphs=config.use_cuda_graphs,
                                  seed=seed)
        self._ids = count()
        self._handoffs: dict[int, KVSource] = {}
        self._steps = self._prefill_tokens = self._decode_tokens = 0

    @classmethod
    def from_model(cls, model: str | ModelSource, *, device: str | None = None, dtype: DType | None = None,
                   cache: CacheConfig | None = None, scheduler: SchedulerConfig | None = None,
                   max_model_len: int | None = None, use_cuda_graphs: bool = True,
                   compile_decode: bool | None = None, seed: int = 0, progress: bool = False) -> Engine:
        """`model`: preset name, checkpoint directory, .gguf file, or `open_model`'s result. Defaults: CUDA +
        bf16 when a GPU is present, else CPU + fp32. `progress`: bars while the weights load."""
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = dtype or (DType.BFLOAT16 if device.startswith("cuda") else DType.FLOAT32)
        ckpt = load_checkpoint(model, dtype=TORCH_DTYPES[dtype], device=device, seed=seed, progress=progress)
        config = EngineConfig(ckpt.config, cache or CacheConfig(), scheduler or SchedulerConfig(), device, dtype,
                              max_model_len, use_cuda_graphs, compile_decode)
        return cls(config, ckpt.weights, tokenizer=ckpt.tokenizer, seed=seed)

    def add_request(self, prompt_ids: Seq[int], sampling: SamplingParams | None = None, *,
                    kv: KVSource | None = None) -> int:
        """Queue a request; returns its id. With `kv`, the first `kv.num_tokens` prompt tokens arrive
        with their KV computed (disaggregated prefill) and only the rest is run here.
        Refuses, before any work, a request longer than the model's limit or the KV cache."""
        sampling = sampling or SamplingParams()
        prompt = [int(t) for t in prompt_ids]
        self._check_request(prompt, sampling)
        rid = next(self._ids)
        eos = self.tokenizer.eos_token_ids if self.tokenizer else self.config.model.eos_token_ids
        seq = Sequence(rid, prompt, sampling, eos_token_ids=eos, num_computed=kv.num_tokens if kv else 0)
        self.scheduler.add(seq)     # raises KVBudgetError if it could never fit the cache
        if kv is not None:
            self._handoffs[rid] = kv
        return rid

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one prefill or decode step; returns the requests that finished in it."""
        step = self.scheduler.schedule()
        for seq in step.admitted:
            if seq.request_id in self._handoffs:
                self.runner.load_kv(seq, self._handoffs.pop(seq.request_id))
        sampled = self._run(step)
        finished = []
        for seq, token in sampled:
            if seq.append_token(token) is not None:
                self.scheduler.finish(seq)
                finished.append(seq.to_output())
        self._steps += 1
        return finished

    def generate(self, prompts: Seq[Seq[int]], sampling: SamplingParams | None = None) -> list[RequestOutput]:
        """Run `prompts` to completion together; outputs in prompt order."""
        ids = [self.add_request(p, sampling) for p in prompts]
        done: dict[int, RequestOutput] = {}
        while self.has_unfinished():
            done.update((out.request_id, out) for out in self.step())
        return [done[i] for i in ids]

    def statistics(self) -> EngineStatistics:
        s = self.scheduler.statistics()
        return EngineStatistics(s.num_waiting, s.num_running, s.num_free_blocks, self.kv.num_blocks,
                                self._steps, self._prefill_tokens, self._decode_tokens)

    def _run(self, step: ScheduledStep) -> list[tuple[Sequence, int]]:
        if step.prefill:
            tokens = self.runner.prefill_sync(step.prefill)
            for chunk in step.prefill:
                chunk.seq.mark_computed(chunk.length)
            self._prefill_tokens += sum(c.length for c in step.prefill)
            return list(zip([c.seq for c in step.prefill if c.samples], tokens, strict=True))
        if step.decode:
            tokens = self.runner.decode_sync(step.decode)
            for seq in step.decode:
                seq.mark_computed(1)
            self._decode_tokens += len(step.decode)
            return list(zip(step.decode, tokens, strict=True))
        return []

    def _check_request(self, prompt: list[int], sampling: SamplingParams) -> None:
        limit, vocab = self.config.model_len, self.config.model.vocab_size
        total = len(prompt) + sampling.max_new_tokens
        if total > limit:
            raise PromptTooLongError(
                f"prompt of {len(prompt)} tokens + max_new_tokens {sampling.max_new_tokens} = {total} "
                f"positions exceeds the model's limit of {limit}; shorten the prompt or max_new_tokens"
            )
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be in [0, {vocab}), got {bad[:5]}")


def _default_num_blocks(config: EngineConfig, dtype: torch.dtype) -> int:
    m, bs = config.model, config.cache.block_size
    per_block = kv_bytes_per_token(m.num_layers, m.num_kv_heads, m.head_dim, dtype) * bs
    if config.device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(config.device))
        return max(2, int(free * config.cache.gpu_memory_fraction) // per_block)
    return 1 + blocks_for(config.cache.cpu_default_tokens, bs)

