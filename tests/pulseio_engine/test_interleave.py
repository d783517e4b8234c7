"""Two batches interleaved layer by layer on one model give bit-identical results to each alone."""

from __future__ import annotations

import copy

import pytest
import torch

from pulseio_engine import Engine, SamplingParams
from pulseio_engine.model.batch_state import BatchState
from pulseio_engine.request import Sequence
from pulseio_engine.scheduler import PrefillChunk


def _engine_with_prefilled(path: str, prompts: list[list[int]]) -> tuple[Engine, list[Sequence]]:
    engine = Engine.from_model(path, device="cpu")
    for p in prompts:
        engine.add_request(p, SamplingParams(max_new_tokens=8, ignore_eos=True))
    engine.step()            # one prefill step for all prompts: every sequence now decodes
    return engine, list(engine.scheduler.running)


def _run_alone(engine: Engine, state: BatchState) -> torch.Tensor:
    return engine.model.forward(state)


@pytest.mark.parametrize("pause_after", [1, 2])
def test_two_decode_batches_interleaved_bitwise(tiny_qwen3, pause_after: int) -> None:
    path, _ = tiny_qwen3
    prompts = [[1, 2, 3], list(range(4, 30)), [7] * 19, list(range(40, 45)), [8, 9]]
    engine, seqs = _engine_with_prefilled(str(path), prompts)
    a, b = seqs[:3], seqs[3:]
    kv_before = copy.deepcopy(engine.kv.kv)
    alone = [_run_alone(engine, engine.runner.prepare_decode(a)),
             _run_alone(engine, engine.runner.prepare_decode(b))]
    kv_alone = copy.deepcopy(engine.kv.kv)

    engine.kv.kv = kv_before
    sa, sb = engine.runner.prepare_decode(a), engine.runner.prepare_decode(b)
    layers = engine.config.model.num_layers
    for layer in range(pause_after):           # A runs ahead, then pauses
        engine.model.layer_step(sa, layer)
    for layer in range(layers):                # B and A alternate layer by layer
        engine.model.layer_step(sb, layer)
        if sa.next_layer < layers:
            engine.model.layer_step(sa, sa.next_layer)
    while sa.next_layer < layers:
        engine.model.layer_step(sa, sa.next_layer)
    assert torch.equal(engine.model.end(sa), alone[0])
    assert torch.equal(engine.model.end(sb), alone[1])
    for got, want in zip(engine.kv.kv, kv_alone, strict=True):
        assert torch.equal(got, want)


def test_prefill_batch_interleaved_with_decode_batch_bitwise(tiny_qwen3) -> None:
    path, _ = tiny_qwen3
    engine, decoding = _engine_with_prefilled(str(path), [[1, 2, 3, 4], list(range(50, 70))])
    newcomer = Sequence(99, list(range(100, 133)), SamplingParams(max_new_tokens=4))
    newcomer.block_table.block_ids = engine.scheduler.allocator.allocate(3)
    chunk = [PrefillChunk(newcomer, 0, 33)]
    kv_before = copy.deepcopy(engine.kv.kv)
    alone = [_run_alone(engine, engine.runner.prepare_decode(decoding)),
             _run_alone(engine, engine.runner.prepare_prefill(chunk))]
    engine.kv.kv = kv_before
    sd, sp = engine.runner.prepare_decode(decoding), engine.runner.prepare_prefill(chunk)
    for layer in range(engine.config.model.num_layers):
        engine.model.layer_step(sp, layer)
        engine.model.layer_step(sd, layer)
    assert torch.equal(engine.model.end(sd), alone[0])
    assert torch.equal(engine.model.end(sp), alone[1])


def test_layer_steps_must_run_in_order(tiny_qwen3) -> None:
    path, _ = tiny_qwen3
    engine, seqs = _engine_with_prefilled(str(path), [[1, 2, 3]])
    state = engine.runner.prepare_decode(seqs)
    with pytest.raises(ValueError, match=r"^batch is at layer 0, cannot run layer 1$"):
        engine.model.layer_step(state, 1)
    with pytest.raises(ValueError, match="run every layer before end"):
        engine.model.end(state)
