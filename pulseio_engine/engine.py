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
from functools import partial
from itertools import count

import torch

from .config import CacheConfig, DType, EngineConfig, OffloadConfig, SchedulerConfig
from .errors import OffloadCapacityError, PromptTooLongError
from .kv.block_table import BlockAllocator, blocks_for
from .kv.cache import KVCache, kv_bytes_per_token
from .kv.handoff import KVSource
from .kv.handoff_loads import HandoffLoads
from .kv.offload_layout import OffloadFootprint
from .kv.retrieval_heads import RetrievalHeads
from .model.checkpoint import ModelSource, load_checkpoint
from .model.llama import CausalLM
from .model.params import ModelWeights
from .model.tokenizer import Tokenizer
from .offload import Offloader
from .request import PENDING_TOKEN, RequestOutput, SamplingParams, Sequence
from .runner import ModelRunner
from .scheduler import PrefillChunk, ScheduledStep, Scheduler

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
                 seed: int = 0, retrieval_heads: RetrievalHeads | None = None) -> None:
        """`retrieval_heads`: the selecting KV head per layer, needed by the SoloHead modes of offload."""
        self.config = config
        self.tokenizer = tokenizer
        dtype = TORCH_DTYPES[config.dtype]
        self.model = CausalLM(config.model, weights, max_len=config.model_len, compile_decode=config.compile,
                              skinny_gemm=config.skinny_gemm)
        m = config.model
        self.offload_only = config.offload is not None and config.offload.offload_only
        paged_layers = config.offload.dense_layers if self.offload_only else m.num_layers   # type: ignore[union-attr]
        num_blocks = config.cache.num_blocks or _default_num_blocks(config, dtype, paged_layers)
        self.kv = KVCache(num_layers=m.num_layers, num_blocks=num_blocks, block_size=config.cache.block_size,
                          num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, dtype=dtype, device=config.device,
                          paged_layers=paged_layers)
        self.scheduler = Scheduler(config.scheduler, BlockAllocator(num_blocks), config.cache.block_size)
        self.runner = ModelRunner(self.model, self.kv, max_batch=config.scheduler.max_num_seqs,
                                  max_model_len=config.model_len, use_cuda_graphs=config.use_cuda_graphs,
                                  seed=seed)
        self.offloader = None if config.offload is None else Offloader(
            config, dtype=dtype, num_blocks=num_blocks, max_blocks_per_seq=self.runner.max_blocks_per_seq,
            scale=self.model.scale, heads=retrieval_heads)
        self._ids = count()
        self._handoffs: dict[int, KVSource] = {}
        self.handoff_loads = HandoffLoads(torch.device(config.device))   # replaceable: `serving.testing.LateLoads`
        self._steps = self._prefill_tokens = self._decode_tokens = 0

    @classmethod
    def from_model(cls, model: str | ModelSource, *, device: str | None = None, dtype: DType | None = None,
                   cache: CacheConfig | None = None, scheduler: SchedulerConfig | None = None,
                   max_model_len: int | None = None, use_cuda_graphs: bool = True,
                   compile_decode: bool | None = None, seed: int = 0, progress: bool = False,
                   offload: OffloadConfig | None = None, retrieval_heads: RetrievalHeads | None = None,
                   skinny_gemm: bool = True) -> Engine:
        """`model`: preset name, checkpoint directory, .gguf file, or `open_model`'s result. Defaults: CUDA +
        bf16 when a GPU is present, else CPU + fp32. `progress`: bars while the weights load. `offload`:
        how offload requests keep their KV (`add_request(offload=True)`); `retrieval_heads`: the
        calibrated layer -> head map the solohead modes need. `skinny_gemm`: `EngineConfig.skinny_gemm`."""
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = dtype or (DType.BFLOAT16 if device.startswith("cuda") else DType.FLOAT32)
        ckpt = load_checkpoint(model, dtype=TORCH_DTYPES[dtype], device=device, seed=seed, progress=progress)
        config = EngineConfig(ckpt.config, cache or CacheConfig(), scheduler or SchedulerConfig(), device, dtype,
                              max_model_len, use_cuda_graphs, compile_decode, offload, skinny_gemm)
        return cls(config, ckpt.weights, tokenizer=ckpt.tokenizer, seed=seed, retrieval_heads=retrieval_heads)

    def add_request(self, prompt_ids: Seq[int], sampling: SamplingParams | None = None, *,
                    kv: KVSource | None = None, offload: bool = False, decode_tail: int = 0) -> int:
        """Queue a request; returns its id. With `kv`, the first `kv.num_tokens` prompt tokens arrive
        with their KV computed (disaggregated prefill) and only the rest is run here. With `offload`,
        its KV lives in the host pool and decode attends to a hot set (`OffloadConfig`). The last
        `decode_tail` prompt tokens are fed one per decode step (see `Sequence`).
        Refuses, before any work, a request longer than the model's limit, the KV cache or the host pool."""
        sampling = sampling or SamplingParams()
        prompt = [int(t) for t in prompt_ids]
        self._check_request(prompt, sampling)
        offloader = None
        if offload:
            offloader = self._check_offload()
        elif self.offload_only:
            raise OffloadCapacityError("this engine is offload-only (OffloadConfig.offload_only): its paged "
                                       "cache keeps only the dense layers; add the request with offload=True")
        rid = next(self._ids)
        eos = self.tokenizer.eos_token_ids if self.tokenizer else self.config.model.eos_token_ids
        seq = Sequence(rid, prompt, sampling, eos_token_ids=eos, num_computed=kv.num_tokens if kv else 0,
                       decode_tail=decode_tail)
        if offloader is not None:
            offloader.open(rid, len(prompt) + sampling.max_new_tokens)   # raises OffloadCapacityError
        try:
            self.scheduler.add(seq)     # raises KVBudgetError if it could never fit the cache
        except BaseException:
            if offloader is not None:
                offloader.close_request(rid)
            raise
        if kv is not None:
            self._handoffs[rid] = kv
        return rid

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one prefill or decode step; returns the requests that finished in it."""
        return self.run(self.schedule())

    def admit(self) -> tuple[Sequence, ...]:
        """Admit waiting requests now (FIFO, while the cache has blocks for them) and load their handed-in KV in
        stream order; -> those admitted. A caller that moves a request here from another engine calls it so the
        KV is in place before the other engine lets it go."""
        admitted = self.scheduler.admit()
        self._load_admitted(admitted, beside=False)
        return admitted

    def schedule(self, *, wait_if_idle: bool = True) -> ScheduledStep:
        """The next step's work (`Scheduler.schedule`). Newly admitted requests' handed-in KV loads beside the steps
        (`HandoffLoads`): they join the first step after it landed, or, when nothing else would run and
        `wait_if_idle`, this one, waiting on the device (a caller with other work passes False)."""
        for rid in self.handoff_loads.landed_nowait():
            self.scheduler.loading.discard(rid)
        admitted = self.scheduler.admit()
        self._load_admitted(admitted, beside=True)
        step = self.scheduler.plan(admitted)
        if step.is_empty and self.scheduler.loading and wait_if_idle:
            self._wait_for_all_kv()
            step = self.scheduler.plan(admitted)
        return step

    def _load_admitted(self, admitted: Seq[Sequence], *, beside: bool) -> None:
        """Load the handed-in KV of requests just admitted: in stream order, or `beside` the steps (`HandoffLoads`;
        those still in flight sit steps out)."""
        for seq in admitted:
            source = self._handoffs.pop(seq.request_id, None)
            if source is None:
                continue
            load = partial(self._load_handoff, seq, source)
            if not beside:
                load()
            elif self.handoff_loads.start(seq.request_id, load):
                self.scheduler.loading.add(seq.request_id)

    def _wait_for_all_kv(self) -> None:
        for rid in list(self.scheduler.loading):
            self.wait_for_kv(rid)

    def wait_for_kv(self, request_id: int) -> None:
        """A request whose handed-in KV is still loading joins the next step: the work enqueued from now on waits
        on the device for its load (no host wait). Nothing to do for any other request."""
        if request_id in self.handoff_loads:
            self.handoff_loads.take(request_id)
            self.scheduler.loading.discard(request_id)

    def run(self, step: ScheduledStep) -> list[RequestOutput]:
        """Run a scheduled step; returns the requests that finished in it."""
        sampled, logits = self._run(step)
        finished = []
        for row, (seq, token) in enumerate(sampled):
            if seq.num_computed < seq.num_tokens:      # a prompt token follows (decode_tail): keep its logprob
                assert logits is not None              # a step that sampled has logits
                logprob = torch.log_softmax(logits[row], dim=-1)[seq.token_ids[seq.num_computed]]
                seq.forced_logprobs.append(float(logprob))
                continue
            if seq.append_token(token) is not None:
                finished.append(self._finish(seq))
        self._steps += 1
        return finished

    def commit_decode(self, seqs: Seq[Sequence], tokens: Seq[int]) -> list[RequestOutput]:
        """A decode step of `seqs` that ran elsewhere (the serving loop's layer-interleaved batches): each fed
        its token at `num_computed` and sampled `tokens[i]`. -> the requests that finished."""
        finished = []
        for seq, token in zip(seqs, tokens, strict=True):
            if seq.num_computed + 1 != seq.num_tokens:
                raise ValueError(f"request {seq.request_id} is not decoding its last token ({seq!r}): commit_decode "
                                 "takes plain decode steps (no prefill, no decode_tail)")
            seq.mark_computed(1)
            if seq.append_token(int(token)) is not None:
                finished.append(self._finish(seq))
        self._decode_tokens += len(seqs)
        self._steps += 1
        return finished

    def advance_decode(self, seqs: Seq[Sequence], steps: int) -> list[int]:
        """`steps` decode steps of `seqs` enqueued elsewhere whose tokens are still on the device (the serving loop's
        overlapped rounds): each moves on as `commit_decode` would move it, its new tokens PENDING_TOKEN until
        `fill_decode`. -> where each one's first new token is in its `token_ids`. One whose output is then complete
        is no longer scheduled but keeps its blocks until `fill_decode` finishes it (its step may be reading them).
        Output lengths must be fixed in advance (ignore_eos): an EOS cannot be seen in a token not yet known."""
        starts = []
        for seq in seqs:
            if not seq.sampling.ignore_eos:
                raise ValueError(f"request {seq.request_id} may stop at an EOS, which a step whose tokens are still on "
                                 "the device cannot tell; advance_decode takes requests with ignore_eos")
            starts.append(seq.num_tokens)
            for _ in range(steps):
                if seq.num_computed + 1 != seq.num_tokens or seq.finish_reason is not None:
                    raise ValueError(f"request {seq.request_id} is not decoding its last token ({seq!r}): "
                                     "advance_decode takes plain decode steps of unfinished requests")
                seq.mark_computed(1)
                seq.append_token(PENDING_TOKEN)
        self._decode_tokens += len(seqs) * steps
        self._steps += steps
        return starts

    def fill_decode(self, seqs: Seq[Sequence], starts: Seq[int], tokens: Seq[int]) -> list[RequestOutput]:
        """The tokens of an `advance_decode` ([steps * len(seqs)], step by step) in place of its PENDING_TOKENs;
        -> the requests that finished with it (their last step)."""
        b = len(seqs)
        steps, rest = divmod(len(tokens), b) if b else (0, 0)
        if rest:
            raise ValueError(f"{len(tokens)} tokens for {b} requests: fill_decode takes whole steps")
        finished = []
        for i, (seq, start) in enumerate(zip(seqs, starts, strict=True)):
            for step in range(steps):
                if seq.token_ids[start + step] != PENDING_TOKEN:
                    raise RuntimeError(f"request {seq.request_id}: token {start + step} is not pending (this is a "
                                       "bug in pulseio_engine)")
                seq.token_ids[start + step] = int(tokens[step * b + i])
            if seq.finish_reason is not None and seq.num_tokens == start + steps:     # its last step
                finished.append(self._finish(seq))
        return finished

    def sequence(self, request_id: int) -> Sequence:
        """A waiting or running request's state (KeyError once it finished or left)."""
        for seq in (*self.scheduler.waiting, *self.scheduler.running):
            if seq.request_id == request_id:
                return seq
        raise KeyError(f"request {request_id} is not waiting or running in this engine")

    def release(self, request_id: int) -> Sequence:
        """Drop a waiting or running request unfinished, returning its KV blocks, host units and hot slots
        (it moved to another engine); -> its state as it was."""
        seq = self.sequence(request_id)
        self.wait_for_kv(request_id)                # its host units and blocks are reused after this
        self.scheduler.remove(seq)
        self._handoffs.pop(request_id, None)
        if self.offloader is not None:
            self.offloader.close_request(request_id)
        return seq

    def _finish(self, seq: Sequence) -> RequestOutput:
        self.scheduler.finish(seq)
        if self.offloader is not None:
            self.offloader.close_request(seq.request_id)
        return seq.to_output()

    def generate(self, prompts: Seq[Seq[int]], sampling: SamplingParams | None = None) -> list[RequestOutput]:
        """Run `prompts` to completion together; outputs in prompt order."""
        ids = [self.add_request(p, sampling) for p in prompts]
        done: dict[int, RequestOutput] = {}
        while self.has_unfinished():
            done.update((out.request_id, out) for out in self.step())
        return [done[i] for i in ids]

    def memory_footprint(self, context_tokens: int) -> OffloadFootprint:
        """Device bytes one offload request of `context_tokens` tokens needs, and what vanilla would."""
        if self.offloader is None:
            raise OffloadCapacityError("memory_footprint describes offload requests; build the engine with "
                                       "EngineConfig.offload (an OffloadConfig)")
        return self.offloader.footprint(context_tokens)

    def close(self) -> None:
        """Stop the offload runtime's threads (a no-op without offload), after any handed-in KV still loading."""
        self._wait_for_all_kv()
        if self.offloader is not None:
            self.offloader.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def statistics(self) -> EngineStatistics:
        s = self.scheduler.statistics()
        return EngineStatistics(s.num_waiting, s.num_running, s.num_free_blocks, self.kv.num_blocks,
                                self._steps, self._prefill_tokens, self._decode_tokens)

    def _run(self, step: ScheduledStep) -> tuple[list[tuple[Sequence, int]], torch.Tensor | None]:
        """-> ((sequence, sampled token) pairs, their logits rows [n, V])."""
        logits: torch.Tensor | None
        if step.prefill:
            tokens, logits = self.runner.prefill_sync(step.prefill, self.offloader if self.offload_only else None)
            for chunk in step.prefill:
                chunk.seq.mark_computed(chunk.length)
                self._offload_prefilled(chunk)
            self._prefill_tokens += sum(c.length for c in step.prefill)
            return list(zip([c.seq for c in step.prefill if c.samples], tokens, strict=True)), logits
        if step.decode:
            offloaded = self.offloader.seqs if self.offloader is not None else {}
            normal = [s for s in step.decode if s.request_id not in offloaded]
            sparse = [s for s in step.decode if s.request_id in offloaded]
            tokens, logits = self.runner.decode_sync(normal) if normal else ([], None)
            if sparse:
                assert self.offloader is not None      # sparse rows are its requests
                more, sparse_logits = self.runner.decode_offload_sync(sparse, self.offloader)
                tokens += more
                logits = sparse_logits if logits is None else torch.cat([logits, sparse_logits])
            for seq in step.decode:
                seq.mark_computed(1)
            self._decode_tokens += len(step.decode)
            return list(zip(normal + sparse, tokens, strict=True)), logits
        return [], None

    def _load_handoff(self, seq: Sequence, source: KVSource) -> None:
        """Handed-in KV: an offload request's offloaded layers go to the host pool, the rest to its blocks."""
        if self.offloader is None or seq.request_id not in self.offloader.seqs:
            self.runner.load_kv(seq, source)
            return
        self.runner.load_kv(seq, source, None if self.offloader.on_gpu else range(self.offloader.dense))
        ids = self.runner.block_ids(seq, len(seq.block_table))
        self.offloader.load_handoff(seq.request_id, source, self.kv, ids)

    def _offload_prefilled(self, chunk: PrefillChunk) -> None:
        """Once an offload request's prompt is in the cache, copy its offloaded layers to the host
        (an offload-only engine's prefill stored them as it went)."""
        if (self.offloader is None or self.offload_only or chunk.seq.request_id not in self.offloader.seqs
                or not chunk.samples):
            return
        n = chunk.start + chunk.length
        ids = self.runner.block_ids(chunk.seq, blocks_for(n, self.kv.block_size))
        self.offloader.store_prefill(chunk.seq.request_id, self.kv, ids, n)

    def _check_offload(self) -> Offloader:
        if self.offloader is None:
            raise OffloadCapacityError("add_request(offload=True) needs an engine built with "
                                       "EngineConfig.offload (an OffloadConfig); pass offload= to from_model")
        return self.offloader

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


def _default_num_blocks(config: EngineConfig, dtype: torch.dtype, paged_layers: int) -> int:
    m, bs = config.model, config.cache.block_size
    per_block = kv_bytes_per_token(paged_layers, m.num_kv_heads, m.head_dim, dtype) * bs
    if config.device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(config.device))
        return max(2, int(free * config.cache.gpu_memory_fraction) // per_block)
    return 1 + blocks_for(config.cache.cpu_default_tokens, bs)

