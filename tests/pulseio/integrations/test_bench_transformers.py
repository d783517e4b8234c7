"""benchmarks/bench_transformers.py --smoke: the GPU benchmark's every mode, on a tiny config on the CPU, as
the H200 run will call it (it runs there once, so it must run here first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_transformers_bench_runs_every_mode_in_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_transformers.py"), "--smoke",
                             "--json", str(out)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(out.read_text())
    results = summary["results"]
    assert list(results) == ["default", "hf-offloaded", "pulseio-layer", "pulseio-sparse-solohead",
                             "pulseio-sparse-quest", "pulseio-sparse-solohead-eager"]
    assert results["hf-offloaded"]["error"] == "transformers' offloaded cache needs a GPU"
    for mode in ("default", "pulseio-layer", "pulseio-sparse-solohead", "pulseio-sparse-quest",
                 "pulseio-sparse-solohead-eager"):
        r = results[mode]
        assert r["error"] is None and r["ms_per_token"] > 0 and len(r["tokens"]) == 5, (mode, r)
    assert results["pulseio-layer"]["same_tokens_as_default"] is True
    assert results["pulseio-sparse-quest"]["recalled_mib_per_step"] > 0, "the smoke budget must make it recall"
    assert set(summary["ratios"]) == {"layer_over_hf_offloaded", "sparse_solohead_over_layer",
                                      "sparse_quest_over_layer", "layer_over_default", "sparse_graphs_over_eager"}
    assert summary["checks"] == {"layer_tokens_equal_default": True, "sparse_graphed_tokens_equal_eager": True}
    assert results["pulseio-sparse-solohead"]["graphed_halves"] == 0, "no CUDA graphs on a CPU"
    assert "| pulseio-layer |" in result.stdout and "random weights" in result.stdout
