"""The outer scheduler and the KV budget (no torch): FIFO admission against the caps (across classes only for
GPU bytes), classes by length, moves of requests that grew, refusals that name their numbers."""

from __future__ import annotations

import pytest

from pulseio_engine.config import ModelConfig, SparseMode
from pulseio_engine.errors import KVBudgetError
from pulseio_engine.model.presets import PRESETS
from pulseio_engine.serving.budget import Footprint, KVBudget, KVClass
from pulseio_engine.serving.outer import OuterScheduler

NRM, OFF = KVClass.NORMAL, KVClass.OFFLOAD
# a footprint in round numbers: normal 10 / block, offload 1 / block + 20 fixed, host 9 / block; blocks of 10 tokens
FP = Footprint(block_size=10, normal_block=10, offload_block=1, offload_fixed=20, host_block=9)


def _outer(gpu: int = 1000, host: int = 1000, threshold: int | None = 100, max_batch: int = 8,
           max_offload: int = 8) -> OuterScheduler:
    return OuterScheduler(KVBudget(FP, gpu_bytes=gpu, host_bytes=host), threshold=threshold, max_batch=max_batch,
                          max_offload=max_offload)


def test_footprint_by_class() -> None:
    assert FP.device_bytes(NRM, 95) == 100 and FP.host_bytes(NRM, 95) == 0
    assert FP.device_bytes(OFF, 95) == 30 and FP.host_bytes(OFF, 95) == 90


def test_footprint_for_a_model() -> None:
    m: ModelConfig = PRESETS["qwen3-14b"]
    fp = Footprint.for_model(m, elem_bytes=2, block_size=16, dense_layers=2, hot_blocks=128,
                             selection=SparseMode.SOLOHEAD)
    token_layer = 2 * 8 * 128 * 2                                           # 4 KiB: K and V of 8 heads, bf16
    assert fp.host_block == 38 * 16 * token_layer
    assert fp.offload_fixed == 38 * 128 * 16 * token_layer                  # the hot set: 128 blocks x 38 layers
    assert fp.normal_block == 40 * 16 * token_layer + 40 * 1 * 128 * 2 * 2  # + a digest row per layer (max, min)
    vanilla = Footprint.for_model(m, elem_bytes=2, block_size=16, dense_layers=2, hot_blocks=128, selection=None)
    assert vanilla.normal_block == 40 * 16 * token_layer
    quest = Footprint.for_model(m, elem_bytes=2, block_size=16, dense_layers=2, hot_blocks=128,
                                selection=SparseMode.QUEST)
    assert quest.offload_block - 2 * 16 * token_layer == 40 * 8 * 128 * 2 * 2


def test_admission_is_fifo_by_class_and_stops_at_a_head_that_does_not_fit() -> None:
    outer = _outer(gpu=260)
    for rid, (i, o) in enumerate([(50, 40), (150, 50), (90, 10), (30, 5)]):
        outer.arrive(rid, i, o)
    d = outer.decide({})
    assert d.admits == ((0, NRM), (1, OFF), (2, NRM)) and d.moves == ()      # 90 + 40 (offload: 20 + 20) + 100 = 230
    assert [w.rid for w in outer.waiting] == [3]                        # 40 more do not fit 260 - 230
    outer.finish(2)
    assert outer.decide({0: 60, 1: 160}).admits == ((3, NRM),)
    assert outer.budget.statistics().gpu_used == 90 + 40 + 40


def test_a_request_waiting_for_the_host_pool_or_a_row_holds_back_its_class_only() -> None:
    outer = _outer(gpu=1000, host=300)
    for rid, (i, o) in enumerate([(150, 10), (200, 10), (20, 5), (120, 5), (30, 5)]):
        outer.arrive(rid, i, o)
    d = outer.decide({})                                        # 1 needs 189 host > 300 - 144: offload stops there
    assert d.admits == ((0, OFF), (2, NRM), (4, NRM))          # 3 (offload, 117 host) would fit, but waits its turn
    assert [w.rid for w in outer.waiting] == [1, 3]
    outer.finish(0)
    assert outer.decide({2: 26, 4: 36}).admits == ((1, OFF),)   # oldest first within the class; 189 + 117 > 300
    assert [w.rid for w in outer.waiting] == [3]

    rows = _outer(max_batch=1)                                  # one normal row, taken by 0
    for rid, (i, o) in enumerate([(10, 5), (20, 5), (150, 10)]):
        rows.arrive(rid, i, o)
    assert rows.decide({}).admits == ((0, NRM), (2, OFF))


def test_once_both_classes_wait_the_rest_of_the_queue_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    outer = _outer(max_batch=1)
    for rid, (i, o) in enumerate([(10, 5), (150, 10)] + [(10 + 140 * (r % 2), 5) for r in range(200)]):
        outer.arrive(rid, i, o)
    assert outer.decide({}).admits == ((0, NRM), (1, OFF))     # both rows taken
    looked: list[int] = []
    class_for = outer.class_for
    monkeypatch.setattr(outer, "class_for", lambda tokens: looked.append(tokens) or class_for(tokens))
    assert outer.decide({0: 16, 1: 161}).admits == ()
    assert len(looked) <= 4, f"walked {len(looked)} waiting requests"   # a normal and an offload head, then stop
    assert [w.rid for w in outer.waiting] == list(range(2, 202))        # order kept


def test_a_request_waiting_for_gpu_bytes_holds_back_everyone_behind_it() -> None:
    outer = _outer(gpu=150, host=1000)
    for rid, (i, o) in enumerate([(90, 5), (90, 5), (150, 10)]):
        outer.arrive(rid, i, o)
    assert outer.decide({}).admits == ((0, NRM),)              # 1 needs 100 > 150 - 100; 2 (36 GPU) would fit
    assert [w.rid for w in outer.waiting] == [1, 2]


def test_no_threshold_keeps_every_request_normal() -> None:
    outer = _outer(threshold=None)
    outer.arrive(0, 10_000 // 100, 5)
    assert outer.decide({}).admits == ((0, NRM),)


def test_a_normal_request_that_grows_to_the_threshold_moves_when_the_budget_holds_it() -> None:
    outer = _outer(gpu=200, host=200)
    outer.arrive(0, 90, 20)                                     # normal, 110 reserved -> 110 GPU
    assert outer.decide({}).admits == ((0, NRM),)
    assert outer.decide({0: 99}).moves == ()
    d = outer.decide({0: 100})
    assert d.moves == ((0, OFF),) and outer.budget.kv_class(0) is OFF
    stats = outer.budget.statistics()
    assert (stats.gpu_used, stats.host_used, stats.normal, stats.offload) == (31, 99, 0, 1)
    outer.arrive(1, 90, 20)
    outer.arrive(2, 150, 10)                                    # offload: 36 GPU, 144 host > 200 - 99 free
    assert outer.decide({0: 101}).admits == ((1, NRM),)
    assert [w.rid for w in outer.waiting] == [2]


def test_a_move_waits_while_the_offload_side_is_full() -> None:
    outer = _outer(max_offload=1)
    outer.arrive(0, 200, 10)
    outer.arrive(1, 90, 20)
    assert outer.decide({}).admits == ((0, OFF), (1, NRM))
    assert outer.decide({0: 201, 1: 100}).moves == ()           # one offload row, taken
    outer.finish(0)
    assert outer.decide({1: 101}).moves == ((1, OFF),)


def test_batch_rows_bound_admission() -> None:
    outer = _outer(max_batch=2)
    for rid in range(3):
        outer.arrive(rid, 10, 5)
    assert len(outer.decide({}).admits) == 2 and len(outer.waiting) == 1


def test_a_request_that_could_never_fit_is_refused_on_arrival_naming_its_numbers() -> None:
    outer = _outer(gpu=100, host=50)
    with pytest.raises(KVBudgetError, match=r"^request 7 \(40 \+ 80 tokens, normal\) needs 120 B of GPU KV and 0 B "
                                            r"of host pool, more than the caps \(100 B GPU, 50 B host\) hold on their "
                                            r"own; raise --gpu-kv-gib \(or --host-kv-gib\), or clip"):
        outer.arrive(7, 40, 80)
    with pytest.raises(KVBudgetError, match=r"request 8 \(400 \+ 10 tokens, offload\)"):
        outer.arrive(8, 400, 10)                                 # fits the GPU (61), not the host (369)
    with pytest.raises(ValueError, match=r"threshold must be >= 1 token, got 0"):
        _outer(threshold=0)
