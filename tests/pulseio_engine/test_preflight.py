"""The memory preflight: its estimate, and refusals made before a single weight is allocated."""

from __future__ import annotations

import pytest
import torch

from pulseio.machine import MemoryBudget, memory_budget, parse_bytes
from pulseio_engine import cli
from pulseio_engine.bench import decode_len, run_bench
from pulseio_engine.model import checkpoint
from pulseio_engine.model.presets import PRESETS, random_weights
from pulseio_engine.preflight import InsufficientMemoryError, check_fits, estimate, weight_bytes


def test_weight_bytes_match_the_built_weights() -> None:
    for tied in (True, False):
        from dataclasses import replace

        cfg = replace(PRESETS["tiny"], tie_word_embeddings=tied)
        assert weight_bytes(cfg, 4) == random_weights(cfg, dtype=torch.float32, device="cpu").parameter_bytes()
    assert 14.5e9 < weight_bytes(PRESETS["qwen3-14b"], 1) < 15.0e9   # Qwen3-14B: 14.8B parameters


def test_memory_limit_env_caps_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULSEIO_MEMORY_LIMIT", "3G")
    assert memory_budget("cpu") == MemoryBudget(3 << 30, "PULSEIO_MEMORY_LIMIT=3G")
    assert parse_bytes("512M") == 512 << 20 and parse_bytes("1.5GiB") == 3 << 29
    with pytest.raises(ValueError, match=r"must look like 123, 512M or 8G, got 'lots'"):
        parse_bytes("lots")


def test_check_fits_states_both_numbers_and_the_fix() -> None:
    need = estimate(PRESETS["qwen3-14b"], dtype_bytes=4, kv_tokens=16384, batch=1, prefill_tokens=16)
    with pytest.raises(InsufficientMemoryError, match=r"needs about 6\d\.\d\d GiB on cpu .* more than the 8\.00 GiB "
                       r"it has \(test\); use --model tiny"):
        check_fits(need, device="cpu", what="qwen3-14b", fixes="use --model tiny",
                   budget=MemoryBudget(8 << 30, "test"))
    check_fits(need, device="cpu", what="qwen3-14b", fixes="", budget=MemoryBudget(1 << 40, "test"))


@pytest.fixture
def no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to build weights fails the test: the preflight must refuse before."""
    monkeypatch.setattr(checkpoint, "random_weights", lambda *a, **k: pytest.fail("weights were built"))
    monkeypatch.setenv("PULSEIO_MEMORY_LIMIT", "8G")


def test_generate_refuses_qwen3_14b_before_allocating(no_weights: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["generate", "--model", "qwen3-14b", "--device", "cpu", "--prompt-ids", "1,2"]) == 2
    err = capsys.readouterr().err
    assert "qwen3-14b (float32) needs about" in err and "PULSEIO_MEMORY_LIMIT=8G" in err
    assert "--device cuda" in err and "smaller --model" in err


def test_bench_refuses_qwen3_14b_before_allocating(no_weights: None) -> None:
    with pytest.raises(InsufficientMemoryError, match=rf"qwen3-14b batch 64 x {decode_len(4000, 5, 100)} tokens needs "
                                                      r"about .*fewer --batch-size or --context-len"):
        run_bench("qwen3-14b", batch_size=64, context_len=4000, steps=100, device="cpu", progress=False)


def test_a_small_run_passes_a_lowered_limit(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PULSEIO_MEMORY_LIMIT", "1G")
    assert cli.main(["generate", "--model", "tiny", "--device", "cpu", "--prompt-ids", "1,2",
                     "--max-new-tokens", "2"]) == 0
    assert "random weights" in capsys.readouterr().err   # said once, on stderr
