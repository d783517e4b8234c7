"""The engine on a CUDA GPU: CUDA-graph + torch.compile decode against transformers and against
itself, layer interleaving, no host syncs in the decode step, and a benchmark smoke run."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_models import hf_greedy

from pulseio_engine import CacheConfig, DType, Engine, SamplingParams, SchedulerConfig
from pulseio_engine.bench import run_bench

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 6, 7], list(range(10, 21)), list(range(30, 47)), [9, 3] * 17, [4] * 40]


def test_gpu_graph_decode_matches_transformers_fp32(tiny_hf) -> None:
    """5 prompts (bucket 8: three padding rows), block 4, chunked prefill, graphs and torch.compile on."""
    path, hf = tiny_hf
    engine = Engine.from_model(str(path), device="cuda", dtype=DType.FLOAT32, cache=CacheConfig(block_size=4),
                               scheduler=SchedulerConfig(max_prefill_tokens=16))
    outs = engine.generate(PROMPTS, SamplingParams(max_new_tokens=24, ignore_eos=True))
    assert engine.runner.graphs.use_graphs and engine.model.compile_error is None
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert list(out.output_ids) == hf_greedy(hf, prompt, 24)


def test_gpu_graph_replay_equals_eager_bf16() -> None:
    sampling = SamplingParams(max_new_tokens=12, ignore_eos=True)
    runs = []
    for graphs in (True, False):
        engine = Engine.from_model("tiny", device="cuda", use_cuda_graphs=graphs, compile_decode=False)
        runs.append([o.output_ids for o in engine.generate(PROMPTS, sampling)])
    assert runs[0] == runs[1]


def test_gpu_two_batches_interleaved_bitwise() -> None:
    engine = Engine.from_model("tiny", device="cuda", compile_decode=False)
    for p in PROMPTS:
        engine.add_request(p, SamplingParams(max_new_tokens=4, ignore_eos=True))
    engine.step()
    a, b = engine.scheduler.running[:2], engine.scheduler.running[2:]
    kv_before = copy.deepcopy(engine.kv.kv)
    alone = [engine.model.forward(engine.runner.prepare_decode(s)) for s in (a, b)]
    engine.kv.kv = kv_before
    sa, sb = engine.runner.prepare_decode(a), engine.runner.prepare_decode(b)
    for layer in range(engine.config.model.num_layers):
        engine.model.layer_step(sb, layer)
        engine.model.layer_step(sa, layer)
    assert torch.equal(engine.model.end(sa), alone[0]) and torch.equal(engine.model.end(sb), alone[1])


def test_gpu_decode_step_never_syncs() -> None:
    engine = Engine.from_model("tiny", device="cuda")
    for p in PROMPTS:
        engine.add_request(p, SamplingParams(max_new_tokens=8, ignore_eos=True))
    engine.step()
    engine.step()                       # captures bucket 8
    graphs = engine.runner.graphs
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            graphs.advance_nowait(8)
            graphs.run_nowait(8)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(graphs.logits[:5]).all()


def test_gpu_bench_smoke() -> None:
    result = run_bench("tiny", batch_size=8, context_len=300, steps=10, warmup=2, progress=False)
    assert result.cuda_graphs and result.finite_logits and result.roofline_ratio > 0
    assert result.compiled, result.compile_error
