"""`pulseio bench` end to end on the CPU backend: records, data checks, JSON and plot."""

from __future__ import annotations

import json
from pathlib import Path

from pulseio.cli import main


def test_bench_on_cpu_writes_verified_records_and_a_plot(tmp_path: Path, capsys) -> None:
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    code = main([
        "bench", "--device", "cpu", "--block-sizes", "4096", "--counts", "8,32", "--peak-max-bytes", str(1 << 20),
        "--host-pool-bytes", str(4 << 20), "--window", "2", "--no-progress", "--json", str(out), "--plot", str(plot),
    ])
    assert code == 0
    data = json.loads(out.read_text())
    records = data["records"]
    recall = [r for r in records if r["kind"] in ("recall", "offload")]
    assert {r["kind"] for r in recall if r["direction"] == "d2h"} == {"offload"}
    assert {r["strategy"] for r in recall} == {"per_block", "gather_dma", "zero_copy", "resident", "batched", "auto"}
    assert {(r["direction"], r["num_blocks"]) for r in recall} == {(d, n) for d in ("h2d", "d2h") for n in (8, 32)}
    assert all(r["verified"] is True for r in recall), "a strategy moved wrong bytes"
    assert all(r["gbps"] > 0 and 0 < r["fraction_of_peak"] for r in recall)
    for auto in (r for r in recall if r["strategy"] == "auto"):  # it ran what was fastest in its cell
        cell = [r for r in recall if r["strategy"] not in ("auto",) and (r["direction"], r["num_blocks"])
                == (auto["direction"], auto["num_blocks"])]
        assert auto["chosen"] == max(cell, key=lambda r: r["gbps"])["strategy"]
    peaks = [r for r in records if r["kind"] == "peak"]
    assert {r["block_bytes"] for r in peaks} == {4096, 16384, 65536, 262144, 1048576}
    # on a CPU the peak comes from copies no cache holds: here only the largest size qualifies
    assert data["meta"]["peak_gbps"]["h2d"] == next(r["gbps"] for r in peaks if r["direction"] == "h2d"
                                                    and r["block_bytes"] == 1 << 20)
    assert "not PCIe" in data["meta"]["measures"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "H2D 4 KiB blocks" in table and "D2H 4 KiB blocks" in table
    auto_h2d = {r["num_blocks"]: r["chosen"] for r in recall if r["strategy"] == "auto" and r["direction"] == "h2d"}
    assert f"auto chose 8: {auto_h2d[8]}, 32: {auto_h2d[32]}" in table


def test_bench_rejects_an_unknown_strategy(capsys) -> None:
    assert main(["bench", "--device", "cpu", "--strategies", "teleport"]) == 2
    assert "'teleport' is not one of per_block, gather_dma" in capsys.readouterr().err


def test_table_reports_the_gemm_control_and_the_spread_of_the_runs_alone() -> None:
    from pulseio.bench.records import BenchRecord
    from pulseio.bench.report import format_table

    def loaded(strategy: str, gbps: float, slowdown: float, alone: tuple[float, ...]) -> BenchRecord:
        return BenchRecord(kind="recall", strategy=strategy, direction="h2d", block_bytes=65536, num_blocks=4096,
                           gbps=gbps, fraction_of_peak=gbps / 55.0, latency_us=None, under_load=True,
                           gemm_slowdown=slowdown, device="x", git_sha="y", verified=None, gemm_ms_alone=alone,
                           gemm_ms_loaded=(2.0, 2.0, 2.0))

    table = format_table({"device": "x", "git_sha": "y", "date": "z", "peak_gbps": {"h2d": 55.0, "d2h": 55.0}}, [
        loaded("none", 0.0, 0.001, (2.00, 2.02, 2.01, 2.00)),
        loaded("batched", 53.0, 0.025, (2.00, 2.04, 2.01, 2.00)),
    ])
    assert "none: no recall (control), GEMM slowed +0.1% (runs alone within 1.0%)" in table
    assert "batched:  53.00 GB/s (0.96 of peak), GEMM slowed +2.5% (runs alone within 2.0%)" in table


def test_bench_memory_check_refuses_before_allocating(monkeypatch) -> None:
    import pytest

    import pulseio
    from pulseio.bench import BenchOptions
    from pulseio.bench.suite import check_bench_memory

    monkeypatch.setenv("PULSEIO_MEMORY_LIMIT", "64M")
    options = BenchOptions(device="cpu", block_sizes=(65536,), counts=(64,), host_pool_bytes=128 << 20)
    with pytest.raises(pulseio.InsufficientMemoryError, match=r"more than the 0\.06 GiB it has "
                                                              r"\(PULSEIO_MEMORY_LIMIT=64M\); pass smaller"):
        check_bench_memory(options, on_gpu=False, device="cpu")
