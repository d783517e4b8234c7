"""`pulseio-engine bench` in the sparse modes on CPU: what each mode moves, holds and waits for."""

from __future__ import annotations

import dataclasses

import pytest

from pulseio_engine.config import SparseMode
from pulseio_engine.sparse_bench import SparseBenchMode, StampTotals, default_profile, run_sparse_bench


@pytest.mark.parametrize("mode", list(SparseBenchMode), ids=[m.value for m in SparseBenchMode])
def test_each_mode_reports_its_traffic_memory_and_waits(mode: SparseBenchMode) -> None:
    r = run_sparse_bench("tiny", mode=mode, batch_size=2, context_len=320, steps=4, token_budget=64,
                         selection=SparseMode.QUEST, device="cpu", progress=False)
    assert r.steps == 4 and r.step_ms > 0 and not r.cuda_graphs
    if mode is SparseBenchMode.QUEST_ALL_ON_GPU:
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
    else:
        assert r.publish_gbps is None and r.publish_to_landed_us is None and r.copy_gbps is None
        assert r.publish_to_taken_us_p50 is None and r.poller_lag_us_p50 is None
    blocked = r.blocked_ms_per_step
    assert blocked == 0 if mode is not SparseBenchMode.OFFLOAD_SYNC else blocked > 0


def test_presets_select_with_the_closest_shipped_locality() -> None:
    profile = default_profile(SparseMode.SOLOHEAD, 2048)
    assert (profile.model, profile.mode, profile.token_budget) == ("qwen2.5-coder-0.5b", SparseMode.SOLOHEAD, 2048)
    overlap = profile.overlap_for(40, 2)
    assert len(overlap) == 40 and overlap[:2] == (1.0, 1.0) and all(0.3 < o < 1 for o in overlap[2:])


def test_stamp_totals_add_up_and_give_percentiles_per_request() -> None:
    a = StampTotals(100, 2, 3e-6, pickups_ns=(1_000, 3_000), publish_to_seen_ns=(-5_000, -1_000))
    b = StampTotals(50, 1, 1e-6, pickups_ns=(2_000,), publish_to_seen_ns=(-4_000,))
    total = a + b
    assert (total.nbytes, total.requests, total.publish_to_landed_s) == (150, 3, pytest.approx(4e-6))
    assert total.pickup_us(50) == 2.0 and total.pickup_us(100) == 3.0
    assert total.poller_lag_us(0) == 0.0 and total.poller_lag_us(100) == 4.0, "relative to the fastest read"
    assert StampTotals().pickup_us(50) is None and StampTotals().poller_lag_us(50) is None


def test_summary_gives_fractions_of_the_peak_only_where_one_was_measured() -> None:
    r = run_sparse_bench("tiny", mode=SparseBenchMode.OFFLOAD_DOORBELL, batch_size=2, context_len=320, steps=2,
                         token_budget=64, selection=SparseMode.QUEST, device="cpu", progress=False)
    assert r.link_peak_gbps is None and r.publish_gbps is not None      # CPU: nothing to compare with
    assert " = " not in r.summary() and f"(publish -> landed {r.publish_gbps:.1f} GB/s, " in r.summary()
    peak = 2 * r.publish_gbps
    on_gpu = dataclasses.replace(r, link_peak_gbps=peak, recall_gbps=peak / 4, recall_fraction_of_peak=0.25,
                                 publish_fraction_of_peak=r.publish_gbps / peak)
    assert f"recall {peak / 4:.1f} GB/s = 0.25 of {peak:.1f} (publish" in on_gpu.summary()
    assert f"publish -> landed {r.publish_gbps:.1f} GB/s = 0.50, " in on_gpu.summary()
