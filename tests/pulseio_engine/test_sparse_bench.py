"""`pulseio-engine bench` in the sparse modes on CPU: what each mode moves, holds and waits for."""

from __future__ import annotations

import dataclasses
import gzip
import json

import pytest

from pulseio_engine.config import SparseMode
from pulseio_engine.evaluation.locality import LocalityProfile, packaged_profiles
from pulseio_engine.sparse_bench import (
    SparseBenchMode,
    StampTotals,
    default_profile,
    run_sparse_bench,
)
from pulseio_engine.step_bytes import StepBytes


@pytest.mark.parametrize("mode", list(SparseBenchMode), ids=[m.value for m in SparseBenchMode])
@pytest.mark.parametrize("selection", [SparseMode.QUEST, SparseMode.SOLOHEAD])
def test_each_mode_reports_its_traffic_memory_and_waits(mode: SparseBenchMode, selection: SparseMode) -> None:
    r = run_sparse_bench("tiny", mode=mode, batch_size=2, context_len=320, steps=4, token_budget=64,
                         selection=selection, device="cpu", progress=False)
    assert r.steps == 4 and r.step_ms > 0 and not r.cuda_graphs and r.selection == selection.value
    assert r.kernels_per_step is None and r.roofline_ms is None, "CPU: no GPU timeline, no copy bandwidth"
    assert r.bytes_per_step == r.step_bytes.total > r.step_bytes.weights > 0
    if mode is SparseBenchMode.ALL_ON_GPU:
        assert r.units_per_step == 0 and r.host_bytes_per_request == 0
        assert r.gpu_bytes_per_request > r.vanilla_gpu_bytes_per_request, "every block, and the digests"
    else:
        assert r.units_per_step > 0 and r.recalled_mib_per_step * 2**20 == pytest.approx(
            r.units_per_step * r.unit_bytes)
        assert r.gpu_bytes_per_request < r.vanilla_gpu_bytes_per_request, "dense layers and hot slots only"
        assert r.host_bytes_per_request > 0
    if mode is SparseBenchMode.OFFLOAD_DOORBELL:  # resident requests: publish -> landed on the producer's clock
        assert r.publish_gbps is not None and r.publish_gbps > 0 and r.publish_to_landed_us > 0
        assert 0 <= r.publish_to_taken_us < r.publish_to_landed_us and r.copy_gbps > r.publish_gbps
        assert 0 <= r.publish_to_taken_us_p50 <= r.publish_to_taken_us_p90
        assert 0 <= r.poller_lag_us_p50 <= r.poller_lag_us_p90
        assert r.landed_early_fraction == 0.0 and r.publish_to_early_landed_us_p50 is None, "no ids mirror on a CPU"
        assert "0% landed early" in r.summary()
    else:
        assert r.publish_gbps is None and r.publish_to_landed_us is None and r.copy_gbps is None
        assert r.publish_to_taken_us_p50 is None and r.poller_lag_us_p50 is None
        assert r.landed_early_fraction is None and "landed early" not in r.summary()
    blocked = r.blocked_ms_per_step
    assert blocked == 0 if mode is not SparseBenchMode.OFFLOAD_SYNC else blocked > 0
    assert 0 <= r.recall_host_ms_per_step <= r.host_ms_per_step


def test_the_sparse_roofline_counts_what_a_step_must_read() -> None:
    """tiny: 4 layers (2 dense, 2 offloaded), 2 KV heads, head_dim 32, fp32 on a CPU; 2 requests of ~327 tokens
    (21 blocks), budget 4 blocks: each offloaded layer reads each request's digests and 4 selected blocks."""
    r = run_sparse_bench("tiny", mode=SparseBenchMode.ALL_ON_GPU, batch_size=2, context_len=320, steps=4,
                         token_budget=64, selection=SparseMode.QUEST, device="cpu", progress=False)
    b: StepBytes = r.step_bytes
    token_kv = 2 * 2 * 32 * 4                                     # K and V, 2 heads, head_dim 32, fp32
    mean_ctx = 320 + 2 + 3 + 1.5                                  # the timed steps' mean context
    assert b.dense_kv == int(2 * 2 * mean_ctx * token_kv)         # 2 dense layers, 2 requests
    assert b.digests == 2 * 2 * 21 * 2 * 32 * 2 * 4               # 2 layers, 2 requests, 21 blocks, 2 heads, max+min
    assert b.selected_kv == 2 * 2 * 4 * 16 * token_kv             # 4 blocks of 16 tokens each
    assert 0 < b.bookkeeping < b.digests


def test_steering_sets_how_much_a_step_recalls() -> None:
    """The measured locality steers the real selection: a row that keeps every middle block recalls almost
    nothing after the first step, one that keeps none recalls its whole middle every step."""
    def recalled(overlap: float) -> float:
        profile = LocalityProfile("synthetic", SparseMode.SOLOHEAD, 320, 64, (2,), (overlap,), (0.1,))
        return run_sparse_bench("tiny", mode=SparseBenchMode.OFFLOAD_DOORBELL, batch_size=2, context_len=320,
                                steps=6, token_budget=64, device="cpu", progress=False, locality=profile).units_per_step
    keep_all, keep_none = recalled(1.0), recalled(0.0)
    assert keep_all <= 2 * 1, "at most a fresh local block per request and step"
    assert keep_none >= 2 * 1 - 0.01 and keep_none > keep_all, "1 middle slot per row (4 - sink 1 - local 2)"


def test_a_larger_hot_set_is_steered_to_refill_from_itself() -> None:
    """A record whose simulated hot cache of 2 budgets fetched nothing (rewarm 1): with hot sets that large, a row
    that keeps none of its middle blocks refills them from blocks its hot set still holds and recalls nothing, for
    the hot slots' bytes (2 offloaded layers x 4 more blocks of 2 KV heads x 32, fp32, per request)."""
    profile = LocalityProfile("synthetic", SparseMode.SOLOHEAD, 320, 64, (2,), (0.0,), (0.5,), {2.0: (0.0,)})
    one, two = (run_sparse_bench("tiny", mode=SparseBenchMode.OFFLOAD_DOORBELL, batch_size=2, context_len=320,
                                 steps=6, token_budget=64, device="cpu", progress=False, locality=profile,
                                 hot_cache=f) for f in (1.0, 2.0))
    assert one.units_per_step >= 2 * 1 - 0.01 and two.units_per_step == 0
    assert (one.hot_cache, two.hot_cache) == (1.0, 2.0)
    assert two.gpu_bytes_per_request - one.gpu_bytes_per_request == 2 * 4 * 2 * 16 * 2 * 32 * 4
    with pytest.raises(ValueError, match=r"hot_cache \(2\) sizes the offload modes' hot sets; mode all-on-gpu has"):
        run_sparse_bench("tiny", mode=SparseBenchMode.ALL_ON_GPU, batch_size=2, context_len=320, steps=2,
                         token_budget=64, device="cpu", progress=False, locality=profile, hot_cache=2.0)


def test_presets_select_with_the_closest_shipped_locality() -> None:
    profile = default_profile(SparseMode.SOLOHEAD, 2048)
    assert (profile.model, profile.mode, profile.token_budget) == ("qwen2.5-coder-0.5b", SparseMode.SOLOHEAD, 2048)
    overlap = profile.overlap_for(40, 2)
    assert len(overlap) == 40 and overlap[:2] == (1.0, 1.0) and all(0.3 < o < 1 for o in overlap[2:])
    measured = sorted({p.context_len for p in packaged_profiles() if (p.model, p.mode, p.token_budget) ==
                       ("qwen2.5-coder-0.5b", SparseMode.SOLOHEAD, 1024)})
    assert len(measured) >= 2 and default_profile(SparseMode.SOLOHEAD, 1024).context_len == measured[-1]
    for context in measured:                                    # the nearest context; of two as near, the longer
        assert default_profile(SparseMode.SOLOHEAD, 1024, context).context_len == context
        assert default_profile(SparseMode.SOLOHEAD, 1024, context + 1).context_len == context
    between = (measured[0] + measured[1]) // 2
    assert default_profile(SparseMode.SOLOHEAD, 1024, between).context_len == measured[1]


def test_stamp_totals_add_up_and_give_percentiles_per_request() -> None:
    a = StampTotals(100, 2, 3e-6, pickups_ns=(1_000, 3_000), publish_to_seen_ns=(-5_000, -1_000))
    b = StampTotals(50, 1, 1e-6, pickups_ns=(2_000,), publish_to_seen_ns=(-4_000,))
    total = a + b
    assert (total.nbytes, total.requests, total.publish_to_landed_s) == (150, 3, pytest.approx(4e-6))
    assert total.pickup_us(50) == 2.0 and total.pickup_us(100) == 3.0
    assert total.poller_lag_us(0) == 0.0 and total.poller_lag_us(100) == 4.0, "relative to the fastest read"
    assert StampTotals().pickup_us(50) is None and StampTotals().poller_lag_us(50) is None


def test_summary_and_compare_vanilla() -> None:
    """The dense step of the same batch runs in the same process; the ratio is the two sustained step times."""
    r = run_sparse_bench("tiny", mode=SparseBenchMode.OFFLOAD_DOORBELL, batch_size=2, context_len=320, steps=2,
                         token_budget=64, selection=SparseMode.QUEST, device="cpu", progress=False,
                         compare_vanilla=True)
    assert r.vanilla is not None and (r.vanilla.batch_size, r.vanilla.context_len) == (2, 320)
    assert r.vanilla_ratio == pytest.approx(r.step_ms / r.vanilla.step_ms)
    assert r.to_dict()["vanilla_ratio"] == r.vanilla_ratio
    text = r.summary()
    assert f"sparse/vanilla {r.vanilla_ratio:.2f}" in text and "roofline" not in text   # CPU: no roofline
    assert r.link_peak_gbps is None and r.publish_gbps is not None and " = " not in text
    on_gpu = dataclasses.replace(r, link_peak_gbps=2 * r.publish_gbps, publish_fraction_of_peak=0.5,
                                 roofline_ms=r.step_ms / 2, roofline_ratio=2.0)
    assert f"publish -> landed {r.publish_gbps:.1f} GB/s = 0.50 " in on_gpu.summary()
    assert f"roofline {r.step_ms / 2:.2f} ms ({r.bytes_per_step / 1e9:.1f} GB) -> 2.00x" in on_gpu.summary()


def test_the_profile_writes_a_table_and_a_timeline(tmp_path) -> None:
    """`--profile PATH`: the profiler's table at PATH, the timed steps' timeline beside it as a gzipped Chrome
    trace holding the engine's ops."""
    path = tmp_path / "step.profile.txt"
    run_sparse_bench("tiny", mode=SparseBenchMode.ALL_ON_GPU, batch_size=2, context_len=320, steps=2,
                     token_budget=64, device="cpu", progress=False, profile=path)
    assert "self_cpu_time_total" in path.read_text()
    with gzip.open(tmp_path / "step.profile.txt.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name") == "aten::linear" for e in events)
    assert not (tmp_path / "step.profile.txt.trace.json").exists(), "only the gzipped timeline is kept"


def test_compare_all_on_gpu_runs_the_bounds_step_in_the_same_process() -> None:
    """An offload step's bound needs the all-on-GPU step of the same batch: it runs after the offload one and is
    recorded; on a CPU there is no link peak, so no bound. The all-on-GPU mode has no bound to compare with."""
    args = dict(batch_size=2, context_len=320, steps=2, token_budget=64, device="cpu", progress=False)
    r = run_sparse_bench("tiny", mode=SparseBenchMode.OFFLOAD_DOORBELL, compare_all_on_gpu=True, **args)
    alone = run_sparse_bench("tiny", mode=SparseBenchMode.ALL_ON_GPU, **args)
    assert r.all_on_gpu_step_ms is not None and r.all_on_gpu_step_ms > 0 and r.all_on_gpu_error is None
    assert r.units_per_step > 0 and alone.units_per_step == 0, "the offload run recalled, the other did not"
    assert r.recall_floor_ms is None and r.recall_bound_ms is None and r.recall_bound_ratio is None
    bounded = dataclasses.replace(r, recall_floor_ms=1.5)
    assert bounded.recall_bound_ms == pytest.approx(r.all_on_gpu_step_ms + 1.5)
    assert bounded.to_dict()["recall_bound_ratio"] == pytest.approx(r.step_ms / (r.all_on_gpu_step_ms + 1.5))
    assert "bound" in bounded.summary()
    with pytest.raises(ValueError, match="^compare_all_on_gpu compares an offload mode"):
        run_sparse_bench("tiny", mode=SparseBenchMode.ALL_ON_GPU, compare_all_on_gpu=True, **args)


def test_stamp_totals_count_the_requests_that_landed_early() -> None:
    """Of the stamped requests, the share whose publish -> landed early was stamped, and its percentiles; sums of
    totals keep every sample."""
    from pulseio_engine.sparse_bench import StampTotals

    a = StampTotals(nbytes=4096, requests=3, publish_to_landed_s=1e-4, publish_to_early_ns=(10_000, 30_000))
    b = StampTotals(nbytes=1024, requests=1, publish_to_landed_s=2e-5)
    both = a + b
    assert both.requests == 4 and both.publish_to_early_ns == (10_000, 30_000)
    assert both.landed_early_fraction() == 0.5 and both.early_us(50) == 20.0
    assert b.landed_early_fraction() == 0.0 and b.early_us(50) is None
    assert StampTotals().landed_early_fraction() is None
