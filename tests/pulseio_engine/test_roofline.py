"""What a decode step must read (`step_bytes`) and the serving roofline built on it (`serving/roofline.py`)."""

from __future__ import annotations

import pytest
import torch

from pulseio_engine import Engine
from pulseio_engine.config import CacheConfig, DType, GroupScore, OffloadConfig, RecallMode, SparseConfig, SparseMode
from pulseio_engine.kv.retrieval_heads import RetrievalHeads
from pulseio_engine.model.checkpoint import load_checkpoint, open_model
from pulseio_engine.serving.config import ServeMode, ServingConfig
from pulseio_engine.serving.engine import ServingEngine
from pulseio_engine.serving.roofline import RoundBytes, roofline
from pulseio_engine.step_bytes import StepShape, step_bytes


@pytest.fixture(scope="module")
def serving() -> ServingEngine:
    """The tiny preset (4 layers, 2 dense; 2 KV heads of 32, fp32) serving pulseinfer: budget 64 tokens (4 blocks)."""
    source = open_model("tiny")
    m = source.config
    config = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=64 << 20, host_kv_bytes=64 << 20, token_budget=64,
                           max_batch=8)
    heads = RetrievalHeads(m.num_kv_heads, best=(0,) * m.num_layers, worst=(1,) * m.num_layers)
    with ServingEngine(config, load_checkpoint(source, dtype=torch.float32, device="cpu"), device="cpu",
                       dtype=DType.FLOAT32, max_model_len=512, heads=heads) as engine:
        yield engine


def test_a_request_within_the_budget_reads_its_whole_kv_and_a_longer_one_its_selection(serving: ServingEngine
                                                                                       ) -> None:
    """Normal engine (all on the GPU, SoloHead: one digest head): 40 tokens is within the 4-block budget, 330
    tokens (21 blocks) selects 4 blocks in each of the 2 offloaded layers."""
    shape = StepShape.of(serving.normal)
    token_kv = 2 * 2 * 32 * 4                                         # K and V, 2 heads of 32, fp32: one layer
    short, long = step_bytes(shape, [40]), step_bytes(shape, [330])
    assert short.weights == long.weights == shape.weight_bytes(1) > 0
    assert (short.dense_kv, short.digests, short.selected_kv, short.bookkeeping) == (4 * 40 * token_kv, 0, 0, 0)
    assert long.dense_kv == 2 * 330 * token_kv
    assert long.digests == 2 * 21 * 1 * 32 * 2 * 4                   # 2 layers, 21 blocks, 1 head, max + min
    assert long.selected_kv == 2 * 4 * 16 * token_kv
    both = step_bytes(shape, [40, 330])
    assert both.total - both.weights == (short.total - short.weights) + (long.total - long.weights)
    assert step_bytes(shape, [330], offload=True).bookkeeping > long.bookkeeping          # the hot-set maps too


@pytest.mark.parametrize("selection,group_score", [(SparseMode.SOLOHEAD, GroupScore.SUM),
                                                   (SparseMode.QUEST, GroupScore.SUM),
                                                   (SparseMode.QUEST, GroupScore.MAX_NORM)])
@pytest.mark.parametrize("recall", [RecallMode.ALL_ON_GPU, RecallMode.DOORBELL])
def test_the_configs_alone_give_the_shape_a_built_engine_has(selection: SparseMode, group_score: GroupScore,
                                                             recall: RecallMode) -> None:
    """`StepShape.for_model` (a report of a model not built here) against `StepShape.of` an engine built from the
    same configs: weights, KV, digest width, selecting rows, bounds per row."""
    source = open_model("tiny")
    sparse = SparseConfig(mode=selection, token_budget=64, group_score=group_score)
    offload = OffloadConfig(sparse=sparse, recall=recall, host_blocks=256, max_seqs=2, dense_layers=1)
    m = source.config
    heads = RetrievalHeads(m.num_kv_heads, best=(0,) * m.num_layers, worst=(1,) * m.num_layers)
    engine = Engine.from_model(source, device="cpu", cache=CacheConfig(num_blocks=64), offload=offload,
                               retrieval_heads=heads)
    try:
        assert StepShape.for_model(m, dtype_bytes=4, sparse=sparse, dense_layers=1) == StepShape.of(engine)
    finally:
        engine.close()


def test_a_larger_hot_set_reads_more_maps_and_the_configs_alone_say_so() -> None:
    """hot_cache 2 (8 entries a row at budget 4): an offload step reads every entry's slot and owner and reads and
    writes its age (24 bytes), per offloaded layer and row; the all-on-GPU step none of it."""
    from dataclasses import replace

    source = open_model("tiny")
    m = source.config
    sparse = SparseConfig(mode=SparseMode.QUEST, token_budget=64)
    offload = OffloadConfig(sparse=sparse, host_blocks=256, max_seqs=2, dense_layers=1, hot_cache=2.0)
    engine = Engine.from_model(source, device="cpu", cache=CacheConfig(num_blocks=64), offload=offload)
    try:
        shape = StepShape.of(engine)
    finally:
        engine.close()
    assert shape == StepShape.for_model(m, dtype_bytes=4, sparse=sparse, dense_layers=1, hot_blocks=8)
    assert shape.sparse is not None and shape.sparse.hot_blocks == 8
    budget_sized = replace(shape, sparse=replace(shape.sparse, hot_blocks=4))
    larger, smaller = (step_bytes(s, [330], offload=True).bookkeeping for s in (shape, budget_sized))
    assert larger - smaller == 3 * 2 * 4 * 24         # 3 offloaded layers, 2 rows (Quest), 4 more entries
    assert step_bytes(shape, [330]) == step_bytes(budget_sized, [330])


def test_round_bytes_count_each_step_of_a_batch_one_token_longer(serving: ServingEngine) -> None:
    shape = StepShape.of(serving.offload)
    read = RoundBytes()
    read.add(shape, [300, 500], steps=2, offload=True)
    one, two = step_bytes(shape, [300, 500], offload=True), step_bytes(shape, [301, 501], offload=True)
    assert (read.weights, read.kv, read.steps) == (2 * one.weights, one.total + two.total - 2 * one.weights, 2)


@pytest.mark.parametrize("recalled,bound", [(0, "hbm"), (10**7, "hbm"), (10**11, "link")])
def test_the_bound_is_the_slower_of_the_device_and_the_link(recalled: int, bound: str) -> None:
    """4 GB at 4000 GB/s of copy bandwidth: 1 ms; at 50 GB/s the link takes 0.2 ms for 10 MB, 2 s for 100 GB."""
    read = RoundBytes(weights=3 * 10**9, kv=10**9, steps=2)
    roof = roofline(read, recalled, 0.5, 1000, copy_gbps=4000.0, link_gbps=50.0)
    assert roof["hbm_s"] == pytest.approx(1e-3)
    assert roof["link_s"] == (None if not recalled else pytest.approx(recalled / 50e9))
    assert roof["bound_s"] == pytest.approx(1e-3 if bound == "hbm" else 2.0)
    assert roof["ratio"] == pytest.approx(0.5 / roof["bound_s"]) and roof["bound_tok_s"] == pytest.approx(
        1000 / roof["bound_s"])
