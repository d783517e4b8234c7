"""Offload requests on CPU: full KV in the pulseio host pool, hot sets recalled through a pulseio
Runtime (HostBackend), sparse attention over the selection. Against vanilla (a budget covering the
context), a plain-torch reference of the same selection (a small budget) and the host copy."""

from __future__ import annotations

import re

import pytest
import torch
from sparse_reference import ref_offload_decode

from pulseio_engine import CacheConfig, Engine, KVHandoff, PromptTooLongError, RetrievalHeads, SamplingParams
from pulseio_engine.config import (
    DEFAULT_GROUP_SCORE,
    Architecture,
    GroupScore,
    ModelConfig,
    OffloadConfig,
    RecallMode,
    SchedulerConfig,
    SparseConfig,
    SparseMode,
)
from pulseio_engine.errors import OffloadCapacityError
from pulseio_engine.kv.block_table import blocks_for
from pulseio_engine.kv.offload_layout import offload_footprint
from pulseio_engine.model.checkpoint import load_checkpoint
from pulseio_engine.serving.testing import LateRecaller

BS = 8
MODES = [(m, r) for m in SparseMode for r in RecallMode]


def _heads(num_layers: int, num_kv_heads: int) -> RetrievalHeads:
    """A stand-in calibration: layer l's best head is l mod Hkv, its worst the next one."""
    return RetrievalHeads(num_kv_heads, best=tuple(layer % num_kv_heads for layer in range(num_layers)),
                          worst=tuple((layer + 1) % num_kv_heads for layer in range(num_layers)))


def _engine(path: str, mode: SparseMode, recall: RecallMode, *, budget: int, dense: int = 2, sink: int = 1,
            local: int = 2, host_blocks: int = 4096, group: GroupScore = DEFAULT_GROUP_SCORE, hot_cache: float = 1.0,
            ahead: bool = False, ahead_budget: float = 1.0, **kw) -> Engine:
    m = load_checkpoint(path, dtype=torch.float32, device="cpu", with_tokenizer=False).config
    offload = OffloadConfig(sparse=SparseConfig(mode=mode, token_budget=budget, block_size=BS, sink_blocks=sink,
                                                local_blocks=local, group_score=group),
                            recall=recall, host_blocks=host_blocks, max_seqs=3, dense_layers=dense, hot_cache=hot_cache,
                            ahead=ahead, ahead_budget=ahead_budget)
    return Engine.from_model(path, device="cpu", cache=CacheConfig(block_size=BS, num_blocks=64), offload=offload,
                             retrieval_heads=_heads(m.num_layers, m.num_kv_heads), **kw)


def _run(engine: Engine, prompts: list[list[int]], sampling: SamplingParams, offload: list[bool]) -> list[tuple]:
    ids = [engine.add_request(p, sampling, offload=o) for p, o in zip(prompts, offload, strict=True)]
    done = {}
    while engine.has_unfinished():
        done.update((out.request_id, out.output_ids) for out in engine.step())
    return [done[i] for i in ids]


PROMPTS = [list(range(20, 57)), list(range(90, 111))]      # 37 and 21 tokens: 5 and 3 blocks of 8


@pytest.mark.parametrize("mode,recall", MODES, ids=[f"{m.value}-{r.value}" for m, r in MODES])
def test_a_budget_covering_the_context_decodes_exactly_as_vanilla(tiny_qwen3, mode, recall) -> None:
    """Two offload requests and a normal one in one batch; greedy tokens equal vanilla's."""
    path = str(tiny_qwen3[0])
    sampling = SamplingParams(max_new_tokens=12, ignore_eos=True)
    prompts = PROMPTS + [list(range(60, 75))]
    vanilla = _run(Engine.from_model(path, device="cpu", cache=CacheConfig(block_size=BS)), prompts, sampling,
                   [False] * 3)
    with _engine(path, mode, recall, budget=64, dense=1) as engine:
        got = _run(engine, prompts, sampling, [True, True, False])
        stats = engine.offloader.statistics()
        steps = 11 * 2          # offloaded layers x decode steps: the doorbell posts each, sync skips empty ones
        if recall is RecallMode.ALL_ON_GPU:
            assert stats.recalls == stats.bytes_recalled == 0, "all on the GPU: nothing to recall"
        else:
            assert stats.bytes_recalled > 0 and stats.bytes_recalled % stats.unit_bytes == 0, "through pulseio"
            assert stats.recalls == steps if recall is RecallMode.DOORBELL else 0 < stats.recalls < steps
        assert stats.unit_heads == (2 if mode is not SparseMode.QUEST else 1)
        assert stats.requests == 0, "finished requests left"
        assert stats.host_units_free == (0 if recall is RecallMode.ALL_ON_GPU else 4095), "and gave their units back"
    assert got == vanilla


REFERENCE_CASES = [(m, r, DEFAULT_GROUP_SCORE, 1.0) for m, r in MODES] + [
    (m, RecallMode.DOORBELL, GroupScore.MAX_NORM, 1.0) for m in SparseMode] + [   # 2 query heads per KV head
    (m, r, DEFAULT_GROUP_SCORE, 2.0) for m in SparseMode for r in (RecallMode.DOORBELL, RecallMode.SYNC)]


@pytest.mark.parametrize("mode,recall,group,hot_cache", REFERENCE_CASES,
                         ids=[f"{m.value}-{r.value}-{g.value}" + ("" if h == 1.0 else f"-hot{h:g}")
                              for m, r, g, h in REFERENCE_CASES])
def test_a_small_budget_equals_the_plain_reference_of_the_same_selection(tiny_qwen3, mode, recall, group,
                                                                         hot_cache) -> None:
    """Budget 4 blocks of 8 (sink 1, local 1) over contexts of up to 8 blocks: each decode step's chosen
    blocks and logits equal `ref_offload_decode`, which recomputes digests, scores and selection by loops. A hot
    set of two budgets changes what is resident, never what is selected or computed."""
    path = str(tiny_qwen3[0])
    with _engine(path, mode, recall, budget=4 * BS, dense=1, local=1, group=group, hot_cache=hot_cache) as engine:
        logits_seen: list[torch.Tensor] = []
        end = engine.model.end
        engine.model.end = lambda state: logits_seen.append(end(state)) or logits_seen[-1]   # record, pass on
        for prompt in PROMPTS:
            engine.add_request(prompt, SamplingParams(max_new_tokens=20, ignore_eos=True), offload=True)
        engine.step()                                              # prefill both
        seqs = list(engine.scheduler.running)
        keys, values = zip(*[_prompt_kv(engine, seq) for seq in seqs], strict=True)
        heads = engine.offloader.digests.heads
        moved = 0
        for _ in range(19):
            tokens = [(seq.token_ids[-1], seq.num_computed) for seq in seqs]
            engine.step()
            for row, (token, position) in enumerate(tokens):
                want, chosen = ref_offload_decode(engine.model, keys[row], values[row], token, position,
                                                  engine.offloader.sparse, 1, heads)
                for layer, rows in chosen.items():
                    assert engine.offloader.last_selection[layer][row].tolist() == rows, (position, layer)
                torch.testing.assert_close(logits_seen[-1][row], want, rtol=0, atol=1e-4)
            moved = engine.offloader.statistics().bytes_recalled
        assert (moved > 0) == (recall is not RecallMode.ALL_ON_GPU)


def _prompt_kv(engine: Engine, seq) -> tuple[list[torch.Tensor], list[torch.Tensor]]:  # noqa: ANN001
    n = seq.num_computed
    ids = torch.tensor(seq.block_table.block_ids[:blocks_for(n, BS)])
    pairs = [engine.kv.gather(layer, ids, n) for layer in range(engine.kv.num_layers)]
    return [k.clone() for k, _ in pairs], [v.clone() for _, v in pairs]


@pytest.mark.parametrize("hot_cache,ahead,late", [(1.0, 0, False), (2.0, 0, False), (2.0, 1, False), (2.0, 1, True),
                                                  (2.0, 2, False)],
                         ids=["hot1", "hot2", "ahead", "ahead-late", "ahead-2-budgets"])
@pytest.mark.parametrize("mode", list(SparseMode))
def test_recalled_kv_is_bit_exact_against_the_host_copy(tiny_qwen3, mode, hot_cache, ahead, late) -> None:
    """Every block the hot set holds (with two budgets, blocks selected earlier too; `ahead` (the prediction's
    budgets), blocks a prediction recalled a layer early, the block being written among them) equals its host copy.
    `late`: recalls are posted only at their wait or after some landing checks (`LateRecaller`), so a recall ahead
    the step never waited for never lands, and its blocks would differ."""
    path = str(tiny_qwen3[0])
    with _engine(path, mode, RecallMode.DOORBELL, budget=3 * BS, dense=0, local=1, hot_cache=hot_cache,
                 ahead=ahead > 0, ahead_budget=max(ahead, 1)) as engine:
        if late:
            engine.offloader.recaller = LateRecaller(engine.offloader.recaller, max_checks=6, seed=3)
        prompt = PROMPTS[0]
        rid = engine.add_request(prompt, SamplingParams(max_new_tokens=9, ignore_eos=True), offload=True)
        engine.step()
        seq = engine.scheduler.running[0]
        blocks = torch.tensor(seq.block_table.block_ids)
        oseq = engine.offloader.seqs[rid]
        store = engine.offloader.store
        hg = store.layout.heads_per_unit
        for layer in range(engine.kv.num_layers):     # the host copy of the prompt equals the prefilled cache
            cache = engine.kv.kv[layer][blocks[:5]].unflatten(3, (-1, hg)).permute(3, 0, 1, 2, 4, 5)
            host = store.host[oseq.host_map[layer, :, :5]]                 # [S, 5, 2, bs, hg, D]
            assert torch.equal(host[:, :4], cache[:, :4])
            assert torch.equal(host[:, 4, :, :len(prompt) % BS], cache[:, 4, :, :len(prompt) % BS])
        for _ in range(8):
            engine.step()
            resident = oseq.resident                                       # [L, S, NB] hot-set entry or -1
            held = (resident >= 0).nonzero()                               # [n, 3] (layer, row, block)
            assert len(held) > 0
            slots = oseq.hot[held[:, 0], held[:, 1], resident[resident >= 0]]
            units = oseq.host_map[held[:, 0], held[:, 1], held[:, 2]]
            hot, host_units = store.hot[slots], store.host[units]              # bit for bit: NaN == NaN here
            assert torch.equal(hot.view(-1).view(torch.uint8), host_units.view(-1).view(torch.uint8))
        assert engine.offloader.last_selection[0].shape[-1] == 3


def test_bad_input_is_refused_before_any_work(tiny_qwen3) -> None:
    path = str(tiny_qwen3[0])
    with pytest.raises(ValueError, match=r"token_budget \(16 tokens = 2 blocks\) must cover sink_blocks \+ "
                                         r"local_blocks \(1 \+ 2\)"):
        SparseConfig(token_budget=16, block_size=8, sink_blocks=1, local_blocks=2)
    with _engine(path, SparseMode.QUEST, RecallMode.DOORBELL, budget=32, host_blocks=20,
                 max_model_len=128) as engine:
        free = engine.offloader.store._units.num_free
        with pytest.raises(PromptTooLongError, match=r"prompt of 120 tokens \+ max_new_tokens 16 = 136 positions "
                                                     r"exceeds the model's limit of 128"):
            engine.add_request([1] * 120, SamplingParams(max_new_tokens=16), offload=True)
        with pytest.raises(OffloadCapacityError, match=r"^an offload request of 80 tokens needs 20 host units of "
                                                       r"2048 B, the host pool has 19 free of 19; raise "
                                                       r"OffloadConfig.host_blocks or shorten the request$"):
            engine.add_request([1] * 70, SamplingParams(max_new_tokens=10), offload=True)
        assert engine.offloader.store._units.num_free == free and not engine.has_unfinished()
    with pytest.raises(OffloadCapacityError, match=r"needs an engine built with EngineConfig.offload"):
        Engine.from_model(path, device="cpu").add_request([1, 2], offload=True)
    with pytest.raises(ValueError, match=r"SparseMode 'solohead' needs retrieval heads; pass retrieval_heads="):
        Engine.from_model(path, device="cpu", offload=OffloadConfig(sparse=SparseConfig(mode=SparseMode.SOLOHEAD)))
    with pytest.raises(ValueError, match=r"OffloadConfig.sparse.block_size \(16\) must equal CacheConfig.block_size "
                                         r"\(8\)"):
        Engine.from_model(path, device="cpu", cache=CacheConfig(block_size=8), offload=OffloadConfig())


def test_footprint_reports_offload_and_vanilla_device_bytes() -> None:
    """SmolLM2-135M (30 layers, 3 KV heads, head_dim 64) in bf16, 8K context, budget 2048."""
    model = ModelConfig(Architecture.LLAMA, 49152, 576, 30, 9, 3, 64, 1536, 8192)
    for mode, unit in ((SparseMode.SOLOHEAD, 2 * 16 * 3 * 64 * 2), (SparseMode.QUEST, 2 * 16 * 64 * 2)):
        f = offload_footprint(model, OffloadConfig(sparse=SparseConfig(mode=mode)), elem_bytes=2,
                              context_tokens=8192)
        layer = 8192 * 2 * 3 * 64 * 2                       # one layer's K and V, 8K tokens
        assert f.unit_bytes == unit
        assert f.vanilla_device_bytes == 30 * layer and f.dense_layer_bytes == 2 * layer
        assert f.hot_bytes == 28 * 2048 * 2 * 3 * 64 * 2 and f.host_bytes == 28 * layer
        width = 3 if mode is SparseMode.QUEST else 1
        assert f.digest_bytes == 28 * 512 * width * 64 * 2 * 2
        assert f.offload_device_bytes == f.dense_layer_bytes + f.hot_bytes + f.digest_bytes
    assert 2.5 < f.saving < 4


def test_hot_cache_is_a_finite_number_of_budgets_of_at_least_one() -> None:
    sparse = SparseConfig(token_budget=10 * 16)                                  # K = 10
    assert OffloadConfig(sparse=sparse).hot_blocks == 10
    assert OffloadConfig(sparse=sparse, hot_cache=1.1).hot_blocks == 11, "not the 12 of 1.1 * 10 in floats"
    assert OffloadConfig(sparse=sparse, hot_cache=1.25).hot_blocks == 13, "12.5 entries rounded up"
    assert OffloadConfig(sparse=sparse, hot_cache=2).hot_blocks == 20
    for bad in (0.5, float("inf"), float("nan"), True, "2"):
        rule = r"^OffloadConfig.hot_cache must be a finite number >= 1.0 \(the hot set in budgets; 1.0: the last "
        with pytest.raises(ValueError, match=rf"{rule}selection only\), got {re.escape(repr(bad))}$"):
            OffloadConfig(hot_cache=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^OffloadConfig.hot_cache \(2.0\) sizes the hot sets of offload requests; "
                                         r"RecallMode.ALL_ON_GPU keeps every block in the paged cache and has none"):
        OffloadConfig(recall=RecallMode.ALL_ON_GPU, hot_cache=2.0)


def test_a_hot_set_of_two_budgets_holds_twice_the_slots_and_bytes() -> None:
    """SmolLM2-135M in bf16, budget 2048 (128 blocks): 256 hot slots per row and offloaded layer, fewer (the
    context's blocks) for a request shorter than that."""
    model = ModelConfig(Architecture.LLAMA, 49152, 576, 30, 9, 3, 64, 1536, 8192)
    one, two = (offload_footprint(model, OffloadConfig(hot_cache=f), elem_bytes=2, context_tokens=8192)
                for f in (1.0, 2.0))
    assert two.hot_bytes == 2 * one.hot_bytes == 28 * 256 * 2 * 16 * 3 * 64 * 2
    assert two.offload_device_bytes - one.offload_device_bytes == one.hot_bytes
    short = offload_footprint(model, OffloadConfig(hot_cache=2.0), elem_bytes=2, context_tokens=3000)   # 188 blocks
    assert short.hot_bytes == 28 * 188 * 2 * 16 * 3 * 64 * 2


@pytest.mark.parametrize("mode", list(SparseMode), ids=[m.value for m in SparseMode])
def test_a_hot_cache_of_two_budgets_reserves_twice_the_hot_slots(tiny_qwen3, mode) -> None:
    """hot_cache 2: each request holds 2K hot-set entries per offloaded layer and selecting row (device slot, owner,
    age), from the open of the request to its close; the device pool holds max_seqs of them, and one recall still
    moves at most a budget per row."""
    path = str(tiny_qwen3[0])
    with _engine(path, mode, RecallMode.DOORBELL, budget=3 * BS, dense=1, local=1, hot_cache=2.0) as engine:
        off = engine.offloader
        store, layers, rows = off.store, engine.config.model.num_layers - 1, off.layout.groups
        assert store.slots_per_seq == layers * rows * 6
        assert off.runtime.config.device_slots == 3 * store.slots_per_seq + 1               # max_seqs 3, slot 0
        assert off.runtime.config.max_blocks_per_request == 3 * rows * 3                   # rows x budget
        free = store.slots_free
        rid = engine.add_request(PROMPTS[0], SamplingParams(max_new_tokens=8, ignore_eos=True), offload=True)
        seq = off.seqs[rid]
        assert store.slots_free == free - store.slots_per_seq
        assert seq.hot.shape == seq.owner.shape == seq.age.shape == (layers, rows, 6)
        assert seq.age.dtype == torch.int32 and not seq.age.any() and (seq.owner == -1).all()
        assert len(set(seq.hot.flatten().tolist())) == store.slots_per_seq, "slots of its own"
        while engine.has_unfinished():
            engine.step()
            held = (seq.owner >= 0).sum(-1)
            assert (held <= 6).all()
        assert (held > 3).any(), "blocks selected earlier stay beside the last selection"
        assert store.slots_free == free, "given back at the close"


def test_a_larger_hot_set_decodes_the_same_tokens_and_recalls_no_more(tiny_qwen3) -> None:
    """The selection does not depend on the hot set's size: a hot set of 2 budgets (or 1.5) decodes the tokens of
    one of a budget, and, holding the last selection and more, never recalls more."""
    path = str(tiny_qwen3[0])
    sampling = SamplingParams(max_new_tokens=16, ignore_eos=True)
    tokens, recalled = {}, {}
    for hot_cache in (1.0, 1.5, 2.0):
        with _engine(path, SparseMode.QUEST, RecallMode.DOORBELL, budget=3 * BS, dense=1, local=1,
                     hot_cache=hot_cache) as engine:
            tokens[hot_cache] = _run(engine, PROMPTS, sampling, [True, True])
            recalled[hot_cache] = engine.offloader.statistics().bytes_recalled
    assert tokens[1.5] == tokens[2.0] == tokens[1.0]
    assert recalled[1.5] <= recalled[1.0] and recalled[2.0] < recalled[1.0]


@pytest.mark.parametrize("mode", list(SparseMode))
def test_recalling_ahead_decodes_the_same_tokens(tiny_qwen3, mode) -> None:
    """`ahead`: each layer's predicted blocks recalled during the layer before. The selection is still the layer's
    own, so the tokens are those without it (contexts of 13 and 9 blocks, hot sets of 5), at a prediction of one
    budget (3 blocks) and of 5/3 (5 blocks); the prefetch posts a recall for every offloaded layer but the first,
    and moves blocks, the larger prediction more."""
    path = str(tiny_qwen3[0])
    sampling = SamplingParams(max_new_tokens=16, ignore_eos=True)
    tokens, stats = {}, {}
    for ahead in (0.0, 1.0, 5 / 3):
        with _engine(path, mode, RecallMode.DOORBELL, budget=3 * BS, dense=1, local=1, hot_cache=1.5,
                     ahead=ahead > 0, ahead_budget=max(ahead, 1.0)) as engine:
            tokens[ahead] = _run(engine, [list(range(20, 120)), list(range(130, 200))], sampling, [True, True])
            stats[ahead] = engine.offloader.statistics()
            layers = engine.kv.num_layers
            assert engine.offloader.offload.ahead_blocks == (5 if ahead > 1 else 3)
    assert tokens[1.0] == tokens[0.0] == tokens[5 / 3]
    steps = stats[0.0].recalls // (layers - 1)                          # one recall a step and offloaded layer
    for ahead in (1.0, 5 / 3):
        assert stats[ahead].recalls == steps * (2 * (layers - 1) - 1)  # and a prefetch for all but the first
        assert stats[ahead].bytes_recalled != stats[0.0].bytes_recalled
    assert stats[5 / 3].bytes_ahead > stats[1.0].bytes_ahead


def test_recalling_ahead_needs_doorbell_recalls_a_larger_hot_set_and_the_step_pieces(tiny_qwen3) -> None:
    rule = r"^OffloadConfig.ahead recalls each layer's predicted blocks into its hot set's spare entries"
    for bad in ({"hot_cache": 1.0}, {"hot_cache": 2.0, "recall": RecallMode.SYNC}):
        with pytest.raises(ValueError, match=rule):
            OffloadConfig(ahead=True, **bad)      # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^OffloadConfig.ahead_budget \(2.5: 5 blocks a row\) exceeds the hot set "
                                         r"\(2.0 budgets: 4 entries\)"):
        OffloadConfig(sparse=SparseConfig(token_budget=2 * BS, block_size=BS, local_blocks=1), hot_cache=2.0,
                      ahead=True, ahead_budget=2.5)
    with pytest.raises(ValueError, match=r"^OffloadConfig.ahead_budget \(1.5\) sizes the prediction of "
                                         r"OffloadConfig.ahead, which is off"):
        OffloadConfig(hot_cache=2.0, ahead_budget=1.5)
    for bad in (0.5, float("nan"), True):
        with pytest.raises(ValueError, match=r"^OffloadConfig.ahead_budget must be a finite number >= 1.0"):
            OffloadConfig(hot_cache=2.0, ahead=True, ahead_budget=bad)
    with pytest.raises(ValueError, match="which use_cuda_graphs=False does not run"):
        _engine(str(tiny_qwen3[0]), SparseMode.SOLOHEAD, RecallMode.DOORBELL, budget=3 * BS, hot_cache=2.0,
                ahead=True, use_cuda_graphs=False)


def test_engine_memory_footprint_names_its_unit(tiny_qwen3) -> None:
    with _engine(str(tiny_qwen3[0]), SparseMode.SOLOHEAD, RecallMode.SYNC, budget=32) as engine:
        f = engine.memory_footprint(512)
        m = engine.config.model
        assert f.unit_bytes == 2 * BS * m.num_kv_heads * m.head_dim * 4
        assert f.unit_bytes == engine.offloader.runtime.host_pool.block_bytes
    assert Engine.from_model("tiny", device="cpu").offloader is None


@pytest.mark.parametrize("offload", [False, True])
def test_a_decoded_tail_gives_the_tokens_of_a_prefilled_one(tiny_qwen3, offload) -> None:
    """The last 9 prompt tokens fed one per decode step (an evaluation's question): same greedy output as
    prefilling them, and the log-probability of each fed token equal to transformers' teacher-forced one."""
    path = str(tiny_qwen3[0])
    prompt, sampling = PROMPTS[0], SamplingParams(max_new_tokens=6, ignore_eos=True)
    with _engine(path, SparseMode.QUEST, RecallMode.DOORBELL, budget=64, dense=1) as engine:
        whole = _run(engine, [prompt], sampling, [offload])[0]
        rid = engine.add_request(prompt, sampling, offload=offload, decode_tail=9)
        seq = engine.scheduler.waiting[-1]
        outputs = {}
        while engine.has_unfinished():
            outputs.update((o.request_id, o.output_ids) for o in engine.step())
    assert outputs[rid] == whole
    with torch.no_grad():                      # teacher-forced log-probabilities of transformers' model
        logits = tiny_qwen3[1](torch.tensor([prompt])).logits[0].float().log_softmax(-1)   # [P, V]
    n = len(prompt)
    want = [float(logits[n - 10 + i, prompt[n - 9 + i]]) for i in range(9)]
    assert seq.forced_logprobs == pytest.approx(want, abs=1e-4)
    with pytest.raises(ValueError, match=r"decode_tail=37 must be in \[0, 37\): at least one prompt token"):
        Engine.from_model(path, device="cpu").add_request(prompt, decode_tail=37)


def _offload_only(path: str, mode: SparseMode, *, budget: int, prefill_tokens: int = 2048) -> Engine:
    """`_engine`'s configuration, offload-only: the paged cache keeps the dense layer alone."""
    m = load_checkpoint(path, dtype=torch.float32, device="cpu", with_tokenizer=False).config
    offload = OffloadConfig(sparse=SparseConfig(mode=mode, token_budget=budget, block_size=BS, local_blocks=1),
                            recall=RecallMode.DOORBELL, host_blocks=4096, max_seqs=3, dense_layers=1,
                            offload_only=True)
    return Engine.from_model(path, device="cpu", cache=CacheConfig(block_size=BS, num_blocks=64), offload=offload,
                             retrieval_heads=_heads(m.num_layers, m.num_kv_heads),
                             scheduler=SchedulerConfig(max_prefill_tokens=prefill_tokens))


@pytest.mark.parametrize("prefill_tokens", [2048, 16, 5], ids=["one-chunk", "chunks-of-16", "chunks-of-5"])
@pytest.mark.parametrize("mode", list(SparseMode), ids=[m.value for m in SparseMode])
def test_an_offload_only_engine_decodes_as_the_mixed_one_and_keeps_only_dense_layers(
        tiny_qwen3, mode, prefill_tokens) -> None:
    """Its prefill stores and attends the offloaded layers through the host pool (earlier chunks read
    back from it); greedy tokens equal the mixed engine's, whose prefill ran through the paged cache."""
    path = str(tiny_qwen3[0])
    sampling = SamplingParams(max_new_tokens=12, ignore_eos=True)
    with _engine(path, mode, RecallMode.DOORBELL, budget=4 * BS, dense=1, local=1) as mixed:
        expected = _run(mixed, PROMPTS, sampling, [True, True])
    with _offload_only(path, mode, budget=4 * BS, prefill_tokens=prefill_tokens) as engine:
        assert [t.shape[0] for t in engine.kv.kv] == [64] + [0] * (engine.kv.num_layers - 1)
        assert _run(engine, PROMPTS, sampling, [True, True]) == expected
        with pytest.raises(OffloadCapacityError, match="offload-only .* add the request with offload=True$"):
            engine.add_request([1, 2, 3], sampling)


def test_handed_in_kv_of_an_offload_request_goes_to_the_host_pool(tiny_qwen3) -> None:
    """KV computed by a prefill instance, handed to an offload-only engine: the same tokens as the
    mixed engine prefilling the prompt itself, and the host copy holds the handed-in KV bit for bit."""
    path = str(tiny_qwen3[0])
    prompt, sampling = PROMPTS[0], SamplingParams(max_new_tokens=10, ignore_eos=True)
    prefill = Engine.from_model(path, device="cpu", cache=CacheConfig(block_size=BS))
    prefill.add_request(prompt, SamplingParams(max_new_tokens=2, ignore_eos=True))
    prefill.step()
    seq = prefill.scheduler.running[0]
    blocks = torch.tensor(seq.block_table.block_ids[:blocks_for(len(prompt), BS)])
    handoff = KVHandoff(tuple(prefill.kv.gather(layer, blocks, len(prompt)) for layer in range(prefill.kv.num_layers)))
    first = seq.output_ids[0]
    with _engine(path, SparseMode.QUEST, RecallMode.DOORBELL, budget=4 * BS, dense=1, local=1) as mixed:
        expected = _run(mixed, [prompt], SamplingParams(max_new_tokens=11, ignore_eos=True), [True])[0]
    with _offload_only(path, SparseMode.QUEST, budget=4 * BS) as engine:
        rid = engine.add_request(prompt + [first], sampling, kv=handoff, offload=True)
        engine.step()                                                # admits, loads, decodes the first token
        oseq, store = engine.offloader.seqs[rid], engine.offloader.store
        for layer in range(1, engine.kv.num_layers):
            k, v = store.read(oseq, layer - 1, len(prompt))
            assert torch.equal(k, handoff.layers[layer][0]) and torch.equal(v, handoff.layers[layer][1])
        out = []
        while engine.has_unfinished():
            out += engine.step()
        assert engine.statistics().prefill_tokens == 0
    assert (first, *out[0].output_ids) == expected


@pytest.mark.parametrize("recall", list(RecallMode), ids=[r.value for r in RecallMode])
def test_the_step_in_graph_pieces_decodes_as_the_eager_step(tiny_qwen3, recall) -> None:
    """With graphs on (the default) an offload step runs as `OffloadStepGraph` pieces cut at the
    recalls; on a CPU they run eagerly, and give the eager step's tokens and residency."""
    path = str(tiny_qwen3[0])
    sampling = SamplingParams(max_new_tokens=14, ignore_eos=True)
    results = []
    for graphs in (True, False):
        with _engine(path, SparseMode.QUEST, recall, budget=3 * BS, dense=1, local=1,
                     use_cuda_graphs=graphs) as engine:
            assert engine.runner.offload_pieces is graphs
            results.append((_run(engine, PROMPTS, sampling, [True, True]),
                            engine.offloader.statistics().bytes_recalled))
    assert results[0] == results[1]


def test_the_step_that_captures_returns_its_own_logits(tiny_qwen3, monkeypatch) -> None:  # noqa: ANN001
    """The first step of a batch runs eagerly, then captures; capturing re-points `logits` at the graph's
    output buffer, which holds nothing until a replay, so that step must return its eager logits."""
    from pulseio_engine.offload_graph import OffloadStepGraph

    def fake_capture(self: OffloadStepGraph) -> None:     # what a capture leaves: an unfilled output buffer
        self.logits = torch.full_like(self.logits, float("nan"))

    path = str(tiny_qwen3[0])
    sampling = SamplingParams(max_new_tokens=6, ignore_eos=True)
    with _engine(path, SparseMode.QUEST, RecallMode.DOORBELL, budget=3 * BS, dense=1, local=1) as engine:
        expected = _run(engine, PROMPTS, sampling, [True, True])
    monkeypatch.setattr(OffloadStepGraph, "_capture", fake_capture)
    with _engine(path, SparseMode.QUEST, RecallMode.DOORBELL, budget=3 * BS, dense=1, local=1) as engine:
        engine.runner.graphs.use_graphs = True        # pieces "captured" (by the fake) on a CPU
        assert _run(engine, PROMPTS, sampling, [True, True]) == expected


@pytest.mark.parametrize("mode", list(SparseMode), ids=[m.value for m in SparseMode])
def test_host_units_for_counts_what_a_request_reserves(tiny_qwen3, mode) -> None:
    """`host_units_for` (what the eval and locality engines size their host pools by) equals what
    `HostStore.open` takes: Hkv units per block under Quest's head-wise selection, one otherwise."""
    from pulseio_engine.kv.offload_layout import host_units_for

    path = str(tiny_qwen3[0])
    with _engine(path, mode, RecallMode.DOORBELL, budget=2 * BS, dense=1, local=1) as engine:
        free = engine.offloader.store.units_free
        engine.add_request(PROMPTS[0], SamplingParams(max_new_tokens=5), offload=True)
        taken = free - engine.offloader.store.units_free
        assert taken == host_units_for(engine.config.model, engine.config.offload, len(PROMPTS[0]) + 5)
        assert taken == 2 * blocks_for(42, BS) * (2 if mode is SparseMode.QUEST else 1)   # 2 offloaded layers


def test_a_recall_that_failed_after_its_wait_fails_the_step(tiny_qwen3, monkeypatch) -> None:  # noqa: ANN001
    """pulseio's watchdog lets a waiting stream go on unwritten slots rather than hang; the step that read
    them must raise (naming the layer) once its tokens are on the host, not return wrong tokens."""
    import pulseio
    from pulseio_engine.kv.recall import RecallError

    path = str(tiny_qwen3[0])
    with _engine(path, SparseMode.SOLOHEAD, RecallMode.DOORBELL, budget=3 * BS, dense=1, local=1) as engine:
        runtime = engine.offloader.recaller.runtime
        real = runtime.post_recall_nowait

        def post_then_fail(**kw):  # noqa: ANN003, ANN202
            done = real(**kw)
            if kw["tag"] == 2:     # layer 2's recall fails once its wait is enqueued, as one the watchdog gave up on
                done.wait(10)
                answers = iter([None])     # what the recall's own look right after device_wait sees
                monkeypatch.setattr(done, "exception",
                                    lambda: next(answers, pulseio.TransferError("did not land (test)")))
            return done

        monkeypatch.setattr(runtime, "post_recall_nowait", post_then_fail)
        engine.add_request(PROMPTS[0], SamplingParams(max_new_tokens=4, ignore_eos=True), offload=True)
        with pytest.raises(RecallError, match=r"recalls of this step failed, so its output is wrong; the first, "
                                              r"for layer 2: did not land \(test\)"):
            while engine.has_unfinished():
                engine.step()


def test_the_runtime_spins_through_the_gap_between_layers_on_a_gpu_only(tiny_qwen3) -> None:
    """On a GPU the poller spins `poll_spin_iterations` loads before it sleeps (a recall arriving while it
    slept would wait out the sleep, every layer); on a CPU it sleeps at once."""
    from pulseio_engine.kv.offload_layout import UnitLayout
    from pulseio_engine.offload import _runtime_config

    model = load_checkpoint(str(tiny_qwen3[0]), dtype=torch.float32, device="cpu", with_tokenizer=False).config
    offload = OffloadConfig(sparse=SparseConfig(mode=SparseMode.SOLOHEAD, token_budget=4 * BS, block_size=BS),
                            poll_spin_iterations=123_456)
    layout = UnitLayout.for_mode(model, offload, 2)
    assert _runtime_config(offload, layout, model.num_layers - 2, "cuda").spin_iterations == 123_456
    assert _runtime_config(offload, layout, model.num_layers - 2, "cpu").spin_iterations == 1
    with pytest.raises(ValueError, match=r"OffloadConfig.poll_spin_iterations must be a positive number, got 0"):
        OffloadConfig(poll_spin_iterations=0)


def test_runtime_config_takes_the_offload_configs_dma_settings(tiny_qwen3: tuple) -> None:
    import pulseio
    from pulseio_engine.kv.offload_layout import UnitLayout
    from pulseio_engine.model.checkpoint import load_checkpoint
    from pulseio_engine.offload import RESIDENT_IDLE_US, _runtime_config

    model = load_checkpoint(str(tiny_qwen3[0]), dtype=torch.float32, device="cpu", with_tokenizer=False).config
    sparse = SparseConfig(mode=SparseMode.SOLOHEAD, token_budget=4 * BS, block_size=BS)
    layout = UnitLayout.for_mode(model, OffloadConfig(sparse=sparse), 2)
    layers = model.num_layers - 2
    default = _runtime_config(OffloadConfig(sparse=sparse), layout, layers, "cuda").dma
    assert default.resident_idle_us == RESIDENT_IDLE_US != pulseio.DmaConfig().resident_idle_us
    assert _runtime_config(OffloadConfig(sparse=sparse), layout, layers, "cpu").dma == pulseio.DmaConfig()
    mine = pulseio.DmaConfig(zero_copy_ctas=48, resident_idle_us=70)
    for device in ("cuda", "cpu"):
        assert _runtime_config(OffloadConfig(sparse=sparse, dma=mine), layout, layers, device).dma == mine
    with pytest.raises(TypeError, match=r"OffloadConfig.dma must be a pulseio.DmaConfig or None, got \{'zero"):
        OffloadConfig(dma={"zero_copy_ctas": 48})  # type: ignore[arg-type]


def test_one_step_graph_serves_any_batch_of_its_size_with_each_request_its_own_state(tiny_qwen3) -> None:
    """A step graph per batch size is kept across changes of members (their state moved into its rows) and
    of sizes, and each request
    still decodes with its own state (KV, hot set, selection): its tokens equal those of a run where the same
    requests decode in fixed batches."""
    path = str(tiny_qwen3[0])
    sampling = SamplingParams(max_new_tokens=6, ignore_eos=True)
    prompts = PROMPTS + [PROMPTS[0][:-9]]     # 37, 21 and 28 tokens: every decoded position below is in a block

    def decode(order: list[list[int]]) -> tuple[dict[int, list[int]], set[int]]:
        with _engine(path, SparseMode.SOLOHEAD, RecallMode.DOORBELL, budget=2 * BS, dense=1, local=1) as engine:
            ids = [engine.add_request(p, sampling, offload=True) for p in prompts]
            engine.step()                                                     # prefill all three
            seqs = [engine.sequence(i) for i in ids]
            graphs = set()
            for batch in order:
                chosen = [seqs[j] for j in batch]
                graph = engine.runner.offload_step(chosen, engine.offloader)
                graphs.add(id(graph))
                engine.commit_decode(chosen, graph.run().argmax(dim=-1).tolist())
            return {j: seqs[j].output_ids for j in range(3)}, graphs

    fixed, _ = decode([[0, 1], [0, 1], [0], [2], [2], [2]])
    churn, graphs = decode([[0, 1], [2], [1, 2], [0], [2, 0]])   # members and sizes change
    assert churn == fixed
    assert len(graphs) == 2, "one step per batch size, kept and reused"
