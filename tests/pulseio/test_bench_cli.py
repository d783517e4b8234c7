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
    recall = [r for r in records if r["kind"] == "recall"]
    assert {r["strategy"] for r in recall} == {"per_block", "gather_dma", "zero_copy", "resident", "batched", "auto"}
    assert {(r["direction"], r["num_blocks"]) for r in recall} == {(d, n) for d in ("h2d", "d2h") for n in (8, 32)}
    assert all(r["verified"] is True for r in recall), "a strategy moved wrong bytes"
    assert all(r["gbps"] > 0 and 0 < r["fraction_of_peak"] for r in recall)
    peaks = [r for r in records if r["kind"] == "peak"]
    assert {r["block_bytes"] for r in peaks} == {4096, 16384, 65536, 262144, 1048576}
    assert data["meta"]["peak_gbps"]["h2d"] == max(r["gbps"] for r in peaks if r["direction"] == "h2d")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "H2D 4 KiB blocks" in table and "D2H 4 KiB blocks" in table


def test_bench_rejects_an_unknown_strategy(capsys) -> None:
    assert main(["bench", "--device", "cpu", "--strategies", "teleport"]) == 2
    assert "'teleport' is not a valid Strategy" in capsys.readouterr().err
