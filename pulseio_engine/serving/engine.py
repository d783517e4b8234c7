"""ServingEngine: the decode instance of a prefill-decode disaggregated deployment, serving two classes.

It owns two `Engine`s over one set of weights: the normal engine (every layer's KV in its paged cache on the
GPU; sparse attention over it through an all-on-GPU `Offloader`, except in vanilla) and, in the offload
modes, the offload engine (offload-only: the dense layers in its paged cache, the rest in the host pool of
its pulseio runtime, a hot set per request). A request is added to one of them by class, with its prompt's KV
handed in (or prefilled), and may move to the other at a step boundary (`move`: its KV read out of one and
loaded into the other, the host pool written or read through pulseio's device view, counted).

`step` is one round: each engine's next work (prefill for requests without handed-in KV, else one decode
step of all its running requests; under IRQ up to `normal_steps` steps of the normal batch's), the decode steps
run by the `InnerScheduler` (IRQ: interleaved layer by layer, each split in per-layer pieces; a batch decoding
alone runs its whole step, one graph, as it has nothing to interleave with; or coupled), their greedy tokens
brought to the host without a sync, and committed. It is `launch` (everything up to the tokens' copy) then
`collect` (their wait and commit). Overlapped (`ServingConfig.overlap_rounds`, `overlapped_round`), the next
round is launched before this one is collected: `launch(overlap=True)` moves its requests on at once, their
tokens pending (`Engine.advance_decode`; finishing is by length), and the next round's input ids that are still
on the device are fed there from this round's tokens (`TokenFeed`), so the host's work between rounds runs while
the GPU decodes; a request that finishes leaves, its blocks with it, only when collected. Pool sizes follow the
`KVBudget`: every pool is large enough for whatever the budget admits into it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from ..config import CacheConfig, DType, EngineConfig, OffloadConfig, RecallMode, SchedulerConfig
from ..copier_options import copier_dma
from ..engine import Engine
from ..kv.handoff import KVSource
from ..kv.handoff_loads import HandoffLoadStatistics
from ..kv.retrieval_heads import RetrievalHeads
from ..model.checkpoint import Checkpoint
from ..offload import SteeringProfile
from ..request import PENDING_TOKEN, SamplingParams, Sequence
from ..runner import RiderSeqs, rider_rows
from ..step_bytes import StepShape
from .batches import ClassTokens, DecodeBatch, HostTokens, TokenFeed, pinned_tokens
from .budget import KVClass
from .config import ServingConfig
from .host_time import HostTimes
from .irq import InnerScheduler, InterleaveStatistics, NoPacer, Pacer, StreamPair
from .pools import plan_pools
from .resident_kv import ResidentKV
from .roofline import RoundBytes


@dataclass(frozen=True)
class StepOutcome:
    """One round: tokens each request gained, and the requests that finished (their whole output)."""

    produced: dict[int, int]
    finished: dict[int, tuple[int, ...]]
    normal_batch: int
    offload_batch: int


@dataclass(frozen=True)
class LaunchedRound:
    """A round `ServingEngine.launch` enqueued, for `collect`: its decode batches, their tokens on the way to the
    host, where an overlapped round's pending tokens start, and what its prefills produced and finished."""

    decodes: dict[KVClass, DecodeBatch | ClassTokens]      # a batch, or its class's part of the halves
    copies: dict[KVClass, HostTokens]
    starts: dict[KVClass, list[int]] | None
    produced: Counter[int]
    finished: dict[int, tuple[int, ...]]


@dataclass
class MoveStatistics:
    to_offload: int = 0
    to_normal: int = 0
    bytes_to_host: int = 0
    bytes_from_host: int = 0


@dataclass
class _Request:
    kv_class: KVClass
    local: int                                        # the request's id in its engine
    seq: Sequence                                     # its state there
    earlier: list[int] = field(default_factory=list)  # tokens generated before its last move


class ServingEngine:
    """See the module doc. Global request ids are the caller's; each engine keeps its own."""

    def __init__(self, config: ServingConfig, checkpoint: Checkpoint, *, device: str, dtype: DType,
                 max_model_len: int, seed: int = 0, heads: RetrievalHeads | None = None,
                 use_cuda_graphs: bool = True, compile_decode: bool | None = None, skinny_gemm: bool = True) -> None:
        config.check_device(device, use_cuda_graphs)
        self.config = config
        model = checkpoint.config
        self.footprint, self.sizes = plan_pools(config, model, dtype)
        sizes = self.sizes

        def engine(blocks: int, offload: OffloadConfig | None) -> Engine:
            cfg = EngineConfig(model, CacheConfig(block_size=config.block_size, num_blocks=blocks),
                               SchedulerConfig(max_num_seqs=config.max_batch), device, dtype, max_model_len,
                               use_cuda_graphs, compile_decode, offload, skinny_gemm)
            return Engine(cfg, checkpoint.weights, tokenizer=checkpoint.tokenizer, seed=seed, retrieval_heads=heads)

        normal_offload = None if config.sparse is None else self._offload_config(1, 1, True)
        self.normal = engine(sizes.normal_blocks, normal_offload)
        self.offload = None
        if config.has_offload:
            self.offload = engine(sizes.offload_blocks, self._offload_config(sizes.host_units, sizes.max_offload,
                                                                             False))
        self._shapes = {c: StepShape.of(e) for c, e in ((KVClass.NORMAL, self.normal), (KVClass.OFFLOAD, self.offload))
                        if e is not None}                   # what each engine's steps read (`RoundBytes`)
        dev = torch.device(device)
        self.inner = InnerScheduler(Pacer(config.pieces_ahead) if dev.type == "cuda" else NoPacer(),
                                    StreamPair(dev) if config.two_streams else None)
        self._pinned = {c: (pinned_tokens(config.max_batch * config.normal_steps, dev),
                            pinned_tokens(config.max_batch * config.normal_steps, dev)) for c in KVClass}
        self._launches = 0
        self._inflight: dict[KVClass, tuple[dict[int, int], torch.Tensor, int]] = {}   # see launch(overlap=True)
        self._requests: dict[int, _Request] = {}
        self._by_local: dict[tuple[KVClass, int], int] = {}
        self.moves = MoveStatistics()
        self.rounds = 0
        self.warming_rounds = 0          # IRQ rounds run coupled because a batch's step ran eagerly on a GPU
        self.halves_rounds = 0           # rounds run as halves (`ServingConfig.halves`)
        self.ridden_rounds = 0           # rounds run as one step, the normal requests riding (`ServingConfig.ride`)
        self.batch_sizes: Counter[tuple[int, int]] = Counter()
        self.normal_step_counts: Counter[int] = Counter()   # rounds by the normal batch's decode steps in them
        self.host = HostTimes()
        self.read = RoundBytes()                 # what the decode steps launched must read (the serving roofline)
        self._graphs_before = 0                  # step graphs built before the statistics were last reset
        self._handoffs_before = HandoffLoadStatistics(0, 0)     # handed-in KV loads before then

    def _offload_config(self, host_units: int, max_seqs: int, on_gpu: bool) -> OffloadConfig:
        c = self.config
        recall = RecallMode.ALL_ON_GPU if on_gpu else c.recall
        dma = None if on_gpu else copier_dma(c.copier_ctas, c.copier_idle_us)
        kept = max(OffloadConfig.kept_step_graphs, 2 * max_seqs)   # a whole and a split graph of every size it admits
        return OffloadConfig(sparse=c.sparse_config(), recall=recall, host_blocks=host_units,  # type: ignore[arg-type]
                             max_seqs=max_seqs, dense_layers=c.dense_layers, offload_only=not on_gpu, dma=dma,
                             kept_step_graphs=kept, hot_cache=1.0 if on_gpu else c.hot_cache,
                             ahead=c.ahead and not on_gpu, ahead_budget=1.0 if on_gpu else c.ahead_budget)

    def copier(self) -> tuple[int, int] | None:
        """The offload runtime's resident copier as it runs: (copy CTAs, idle microseconds); None without one."""
        off = None if self.offload is None else self.offload.offloader
        if off is None or off.runtime is None:
            return None
        dma = off.runtime.config.dma
        return dma.zero_copy_ctas, dma.resident_idle_us

    def engine_for(self, kv_class: KVClass) -> Engine:
        if kv_class is KVClass.OFFLOAD:
            if self.offload is None:
                raise ValueError(f"{self.config.describe()} has no offload engine: every request is normal")
            return self.offload
        return self.normal

    @property
    def carries_riders(self) -> bool:
        """Whether normal requests ride in offload steps (`ServingConfig.halves` or `ride`)."""
        return self.config.halves or self.config.ride

    def seat_riders(self, normal: int) -> None:
        """Seat the padding rows of riders' steps for normal batches of up to `normal` requests now: a capture
        reads the seats' rows, and seats that grow later make every step captured before them stale."""
        if self.carries_riders and normal > 0:
            assert self.normal.offloader is not None, "pulseinfer's normal engine selects: it has an offloader"
            self.normal.offloader.padded([], rider_rows(normal))

    def set_steering(self, profile: SteeringProfile) -> None:
        """Random weights: steer both engines' selection to a measured locality (`sparse_bench`'s reason)."""
        for eng in (self.normal, self.offload):
            if eng is not None and eng.offloader is not None:
                eng.offloader.steering = profile

    def add(self, rid: int, prompt_ids: list[int], max_new_tokens: int, kv_class: KVClass,
            kv: KVSource | None = None) -> None:
        """A request arrives in `kv_class`, greedy, decoding exactly `max_new_tokens` tokens (no EOS stop);
        `kv`: its prompt's KV handed in (all but the last prompt token), or None to prefill it here."""
        eng = self.engine_for(kv_class)
        local = eng.add_request(prompt_ids, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True), kv=kv,
                                offload=eng.offloader is not None)
        self._requests[rid] = _Request(kv_class, local, eng.sequence(local))
        self._by_local[kv_class, local] = rid

    def move(self, rid: int, to: KVClass) -> None:
        """Move a running request's KV to the other class's engine at a step boundary; its tokens continue (all of
        them on the host: collect an overlapped round first)."""
        req = self._requests[rid]
        if req.seq.token_ids[-1] == PENDING_TOKEN:           # pending tokens are the last ones (advance_decode)
            raise RuntimeError(f"request {rid} has tokens of a launched round not collected yet; collect it before "
                               "moving the request (this is a bug in the caller)")
        src, dst = self.engine_for(req.kv_class), self.engine_for(to)
        seq = req.seq
        src.wait_for_kv(req.local)                          # its KV is read from here on
        kv = ResidentKV(src, seq, seq.num_computed)
        left = seq.sampling.max_new_tokens - len(seq.output_ids)
        local = dst.add_request(seq.token_ids, SamplingParams(max_new_tokens=left, ignore_eos=True), kv=kv,
                                offload=dst.offloader is not None)
        if local not in {s.request_id for s in dst.admit()}:
            raise RuntimeError(f"request {rid} could not join the {to.value} engine at once (this is a bug in "
                               "pulseio_engine: the budget admitted it)")
        taken = dst.sequence(local)
        moved = ResidentKV(dst, taken, seq.num_computed).host_bytes()
        out = kv.host_bytes()
        src.release(req.local)
        del self._by_local[req.kv_class, req.local]
        self._requests[rid] = _Request(to, local, taken, req.earlier + list(seq.output_ids))
        self._by_local[to, local] = rid
        m = self.moves
        m.to_offload, m.to_normal = m.to_offload + (to is KVClass.OFFLOAD), m.to_normal + (to is KVClass.NORMAL)
        m.bytes_to_host, m.bytes_from_host = m.bytes_to_host + moved, m.bytes_from_host + out

    def lengths(self) -> dict[int, int]:
        """Running (and waiting) requests' tokens now: prompt + generated."""
        return {rid: r.seq.num_tokens for rid, r in self._requests.items()}

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def step(self) -> StepOutcome:
        """One round, launched and collected (see the module doc)."""
        return self.collect(self.launch())

    def launch(self, *, overlap: bool = False) -> LaunchedRound:
        """Enqueue one round: prefill runs now, the decode steps are enqueued and their tokens start for the host.
        `overlap`: the requests move on at once, their new tokens pending (`Engine.advance_decode`), so the next
        round can be launched before this one is collected; its input ids that are still on the device are fed
        there from this round's tokens. Collect rounds in the order they were launched."""
        produced: Counter[int] = Counter()
        finished: dict[int, tuple[int, ...]] = {}
        due = {}
        host = self.host
        host.start()
        engines = {c: eng for c, eng in ((KVClass.NORMAL, self.normal), (KVClass.OFFLOAD, self.offload))
                   if eng is not None}
        works = {c: eng.schedule(wait_if_idle=False) for c, eng in engines.items()}
        if all(work.is_empty for work in works.values()):    # only handed-in KV still loading: wait for it here
            works = {c: eng.schedule() for c, eng in engines.items()}
        for kv_class, work in works.items():
            eng = engines[kv_class]
            if work.prefill:
                for chunk in work.prefill:
                    produced[self._by_local[kv_class, chunk.seq.request_id]] += int(chunk.samples)
                self._finished(kv_class, eng.run(work), finished)
            elif work.decode:
                due[kv_class] = (eng, work.decode)
        host.lap("schedule")
        split = self.config.interleaves and len(due) == 2      # alone, a batch has nothing to interleave with
        halves = ridden = None
        batches: dict[KVClass, DecodeBatch] = {}
        decodes: dict[KVClass, DecodeBatch | ClassTokens]
        ride = self.config.ride and len(due) == 2           # the normal requests ride in the offload step
        if split and self.config.halves and len(due[KVClass.OFFLOAD][1]) >= 2:
            decodes, halves = self._halves(due[KVClass.NORMAL], due[KVClass.OFFLOAD])
        elif ride:
            decodes, ridden = self._ride(due[KVClass.NORMAL], due[KVClass.OFFLOAD])
        else:
            batches = {c: DecodeBatch(eng, seqs, split=split, steps=self._steps(c, seqs), feed=self._feed(c, seqs))
                       for c, (eng, seqs) in due.items()}
            decodes = dict(batches)
        for c, b in decodes.items():
            self.read.add(self._shapes[c], [s.num_tokens for s in b.seqs], b.steps, offload=c is KVClass.OFFLOAD,
                          riding=ride and c is KVClass.NORMAL)
        host.lap("prepare")
        paced = self.inner.pacer.waited_s
        if halves is not None and not any(b.warming for b in halves):
            self.halves_rounds += 1
            self.inner.halves(*halves)
        elif halves is not None:     # a new pair's first step on a GPU runs eagerly, each half whole: then both capture
            self.warming_rounds += 1
            self.inner.coupled(*halves)
        elif ridden is not None:
            self.ridden_rounds += 1
            self.inner.coupled(ridden)
        elif split and not any(b.warming for b in batches.values()):
            self.inner.interleave(batches.get(KVClass.NORMAL), batches.get(KVClass.OFFLOAD))
        else:                        # a batch's first step on a GPU runs first and alone: see DecodeBatch.warming
            self.warming_rounds += split
            self.inner.coupled(*sorted(batches.values(), key=lambda b: not b.warming))
        pinned = self._launches % 2                      # two landing buffers: an overlapped round's copy may run
        self._launches += 1                              # before the host has read the previous round's
        copies = {c: HostTokens(b.tokens_nowait(), self._pinned[c][pinned]) for c, b in decodes.items()}
        starts = None
        if overlap:
            starts = {c: b.engine.advance_decode(b.seqs, b.steps) for c, b in decodes.items()}
            for c, b in decodes.items():                 # where the next round finds each request's last token
                rows = {seq.request_id: i for i, seq in enumerate(b.seqs)}
                self._inflight[c] = (rows, b.tokens_nowait(), (b.steps - 1) * b.size)
        host.lap("launch")
        host.move(self.inner.pacer.waited_s - paced, "launch", "pace")
        return LaunchedRound(decodes, copies, starts, produced, finished)

    def collect(self, launched: LaunchedRound) -> StepOutcome:
        """Wait for a launched round's tokens (polling, never syncing) and commit them; -> what it produced."""
        host, produced, finished = self.host, launched.produced, launched.finished
        host.start()
        for kv_class, batch in launched.decodes.items():
            tokens = launched.copies[kv_class].wait_list()
            host.lap("tokens")
            for seq in batch.seqs:
                produced[self._by_local[kv_class, seq.request_id]] += batch.steps
            if launched.starts is not None:
                self._finished(kv_class, batch.engine.fill_decode(batch.seqs, launched.starts[kv_class], tokens),
                               finished)
            else:
                b = batch.size
                for step in range(batch.steps):           # every request has a token of each: see _steps
                    self._finished(kv_class, batch.engine.commit_decode(batch.seqs, tokens[step * b:(step + 1) * b]),
                                   finished)
            host.lap("commit")
        if self.offload is not None and self.offload.offloader.recaller is not None:     # type: ignore[union-attr]
            self.offload.offloader.recaller.check_landed()                                # type: ignore[union-attr]
        normal, offload = launched.decodes.get(KVClass.NORMAL), launched.decodes.get(KVClass.OFFLOAD)
        sizes = (0 if normal is None else normal.size, 0 if offload is None else offload.size)
        host.lap("commit")
        self.rounds += 1
        self.batch_sizes[sizes] += 1
        if normal is not None:
            self.normal_step_counts[normal.steps] += 1
        return StepOutcome(dict(produced), finished, *sizes)

    def run_round(self, pending: LaunchedRound | None) -> tuple[list[StepOutcome], LaunchedRound | None]:
        """One round as the config runs them: overlapped (`overlapped_round`), or launched and collected at once
        (`step`; `pending` is then None and stays None). -> the rounds collected, and the one in flight."""
        if self.config.overlap_rounds:
            return self.overlapped_round(pending)
        return [self.step()], None

    def overlapped_round(self, pending: LaunchedRound | None) -> tuple[list[StepOutcome], LaunchedRound | None]:
        """Launch a round overlapped, then collect `pending` (the one launched before it); -> the rounds collected,
        and the one now in flight (None where the new round put nothing on the device: its prefills' outcome, if
        any, is collected at once)."""
        launched = self.launch(overlap=True)
        outcomes = [] if pending is None else [self.collect(pending)]
        if launched.decodes:
            return outcomes, launched
        if launched.produced or launched.finished:
            outcomes.append(self.collect(launched))
        return outcomes, None

    def _halves(self, normal: tuple[Engine, Seq[Sequence]], offload: tuple[Engine, Seq[Sequence]]
                ) -> tuple[dict[KVClass, DecodeBatch | ClassTokens], tuple[DecodeBatch, DecodeBatch]]:
        """The round's steps as halves (`ServingConfig.halves`): the offload requests in two, the first half (the
        larger) with the normal requests riding, the second in the seats' rows after the first's. -> each class's
        view of the tokens, and the two halves."""
        (eng_n, seqs_n), (eng_o, seqs_o) = normal, offload
        off_n, off_o = eng_n.offloader, eng_o.offloader
        assert off_n is not None and off_o is not None, "pulseinfer's engines both select: offload steps"
        cut = (len(seqs_o) + 1) // 2
        first, second = tuple(seqs_o[:cut]), tuple(seqs_o[cut:])
        graphs = eng_o.runner.offload_halves(first, second, off_o, RiderSeqs(eng_n.kv, off_n, tuple(seqs_n)))
        a = DecodeBatch(eng_o, first, split=True, feed=self._feed(KVClass.OFFLOAD, first), graph=graphs[0],
                        rider_feed=self._feed(KVClass.NORMAL, seqs_n))
        b = DecodeBatch(eng_o, second, split=True, feed=self._feed(KVClass.OFFLOAD, second), graph=graphs[1])
        views: dict[KVClass, DecodeBatch | ClassTokens] = {
            KVClass.NORMAL: ClassTokens(eng_n, seqs_n, [(a, cut, cut + len(seqs_n))]),
            KVClass.OFFLOAD: ClassTokens(eng_o, seqs_o, [(a, 0, cut), (b, 0, len(second))])}
        return views, (a, b)

    def _ride(self, normal: tuple[Engine, Seq[Sequence]], offload: tuple[Engine, Seq[Sequence]]
              ) -> tuple[dict[KVClass, DecodeBatch | ClassTokens], DecodeBatch]:
        """The round as one step (`ServingConfig.ride`): the offload batch's, the normal requests riding in it after
        the offload requests' rows. -> each class's view of the tokens, and the step."""
        (eng_n, seqs_n), (eng_o, seqs_o) = normal, offload
        off_n, off_o = eng_n.offloader, eng_o.offloader
        assert off_n is not None and off_o is not None, "pulseinfer's engines both select: offload steps"
        graph = eng_o.runner.offload_step(seqs_o, off_o, riders=RiderSeqs(eng_n.kv, off_n, tuple(seqs_n)))
        step = DecodeBatch(eng_o, seqs_o, split=False, feed=self._feed(KVClass.OFFLOAD, seqs_o), graph=graph,
                           rider_feed=self._feed(KVClass.NORMAL, seqs_n))
        rows = len(seqs_o)
        views: dict[KVClass, DecodeBatch | ClassTokens] = {
            KVClass.NORMAL: ClassTokens(eng_n, seqs_n, [(step, rows, rows + len(seqs_n))]),
            KVClass.OFFLOAD: ClassTokens(eng_o, seqs_o, [(step, 0, rows)])}
        return views, step

    def _feed(self, kv_class: KVClass, seqs: Seq[Sequence]) -> TokenFeed | None:
        """The batch's input ids still on the device: its requests whose last token is pending (an overlapped
        round launched before), taken from that round's tokens."""
        pending = [(i, s.request_id) for i, s in enumerate(seqs) if s.token_ids[s.num_computed] == PENDING_TOKEN]
        if not pending:
            return None
        rows, tokens, offset = self._inflight[kv_class]
        return TokenFeed.upload([i for i, _ in pending], tokens, [offset + rows[rid] for _, rid in pending])

    def _steps(self, kv_class: KVClass, seqs: Seq[Sequence]) -> int:
        """Decode steps of a batch this round: the normal batch's `normal_steps`, fewer when one of its requests
        has fewer tokens left (so none finishes between them); the offload batch's one. `DecodeBatch` runs one
        where the batch is not split (alone, or coupled) or still warming up."""
        if kv_class is not KVClass.NORMAL:
            return 1
        return min(self.config.normal_steps, *(s.sampling.max_new_tokens - len(s.output_ids) for s in seqs))

    def _finished(self, kv_class: KVClass, outputs: list, finished: dict[int, tuple[int, ...]]) -> None:
        for out in outputs:
            rid = self._by_local.pop((kv_class, out.request_id))
            finished[rid] = (*self._requests.pop(rid).earlier, *out.output_ids)

    def reset_statistics(self) -> None:
        """Count rounds, batch sizes, IRQ's m, moves, the bytes read and the sampled recall flights from zero again
        (after a warm-up); pulseio's own counters (`recall_statistics`, `runtime_statistics`) run on, so callers take a
        baseline of those."""
        if self._requests:
            raise RuntimeError(f"reset_statistics with {len(self._requests)} requests running (this is a bug in "
                               "pulseio_engine: the warm-up must finish its requests)")
        self.moves = MoveStatistics()
        self.rounds = self.warming_rounds = self.halves_rounds = self.ridden_rounds = 0
        self.batch_sizes.clear()
        self.normal_step_counts.clear()
        self.inner.stats = InterleaveStatistics()
        self.host = HostTimes()
        self.read = RoundBytes()
        self._graphs_before += self.step_graphs_built()
        self._handoffs_before = self._handoff_totals()
        off = None if self.offload is None else self.offload.offloader
        if off is not None and off.recaller is not None:
            off.recaller.reset_flights()

    def step_graphs_built(self) -> int:
        """Both engines' offload step graphs built (captured, on a GPU) since the statistics were reset: a batch
        size met for the first time, or again after the runner dropped its graph."""
        built = sum(eng.runner.step_graphs_built for eng in (self.normal, self.offload) if eng is not None)
        return built - self._graphs_before

    def handoff_statistics(self) -> HandoffLoadStatistics:
        """Both engines' handed-in KV loads since the statistics were reset (`HandoffLoads.statistics`)."""
        now, before = self._handoff_totals(), self._handoffs_before
        return HandoffLoadStatistics(now.landed - before.landed, now.waited - before.waited)

    def _handoff_totals(self) -> HandoffLoadStatistics:
        stats = [eng.handoff_loads.statistics() for eng in (self.normal, self.offload) if eng is not None]
        return HandoffLoadStatistics(sum(s.landed for s in stats), sum(s.waited for s in stats))

    def recall_statistics(self) -> tuple[int, int, int]:
        """(recall requests, bytes recalled, of them bytes recalled ahead) of the offload engine so far."""
        if self.offload is None or self.offload.offloader is None:
            return 0, 0, 0
        stats = self.offload.offloader.statistics()
        return stats.recalls, stats.bytes_recalled, stats.bytes_ahead

    def recall_flights(self) -> dict | None:
        """The offload engine's sampled recall flights, a layer's own and ahead (`Recaller.flights`, summarized);
        None without a doorbell recaller."""
        off = None if self.offload is None else self.offload.offloader
        if off is None or off.recaller is None or off.recaller.mode is not RecallMode.DOORBELL:
            return None
        return {kind: flights.summary() for kind, flights in off.recaller.flights.items()}

    def host_pool_bytes(self) -> int:
        """The offload engine's host pool (pinned host memory), 0 without one."""
        off = None if self.offload is None else self.offload.offloader
        return 0 if off is None or off.runtime is None else off.runtime.host_pool.blocks.nbytes

    def runtime_statistics(self) -> object | None:
        """The offload engine's pulseio `RuntimeStatistics` (None without one)."""
        off = None if self.offload is None else self.offload.offloader
        return None if off is None or off.runtime is None else off.runtime.statistics()

    def close(self) -> None:
        for eng in (self.normal, self.offload):
            if eng is not None:
                eng.close()

    def __enter__(self) -> ServingEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
