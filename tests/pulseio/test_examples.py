"""Every example runs as a user would run it, on the CPU backend, and does what it says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_copy_blocks_example_runs_on_cpu() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "01_copy_blocks.py"), "--device", "cpu", "--blocks", "64"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if "bit-exact" in line]
    assert len(lines) == 5, result.stdout  # one per strategy


def _run_example(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_doorbell_example_runs_on_cpu_and_every_recall_lands() -> None:
    result = _run_example("02_doorbell_recall.py")
    assert result.returncode == 0, result.stderr[-2000:]
    steps = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 8 and all("recalled 16 blocks" in line for line in steps), result.stdout


def test_decode_example_runs_on_cpu_and_every_request_finishes() -> None:
    result = _run_example("03_decode_tiny.py")
    assert result.returncode == 0, result.stderr[-2000:]
    done = [line for line in result.stdout.splitlines() if " done (" in line]
    assert len(done) == 3, result.stdout  # the two first requests and the one that joined at step 3


def test_your_offloader_example_recalls_layers_and_top_k_bit_exact_on_cpu() -> None:
    result = _run_example("04_your_offloader.py", "--device", "cpu", "--layers", "3", "--steps", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    steps = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 6 and all("bit-exact" in line for line in steps), result.stdout
    assert "failed: 0" in result.stdout


def _same_tokens(stdout: str) -> dict[str, bool]:
    """Each cache line of 05_transformers_generate.py -> whether its tokens equal the default cache's."""
    return {line.split(":")[0]: line.split("same tokens as the default cache: ")[1].startswith("True")
            for line in stdout.splitlines() if "same tokens as the default cache" in line}


def test_transformers_example_gives_the_default_caches_tokens_with_every_pulseio_cache() -> None:
    result = _run_example("05_transformers_generate.py", "--device", "cpu")
    assert result.returncode == 0, result.stderr[-2000:]
    same = _same_tokens(result.stdout)
    assert len(same) == 4 and all(same.values()), result.stdout  # default, layer, Quest, SoloHead (covering budget)


@pytest.mark.slow
def test_transformers_example_on_smollm2() -> None:
    result = _run_example("05_transformers_generate.py", "--device", "cpu", "--model", "smollm2")
    assert result.returncode == 0, result.stderr[-2000:]
    same = _same_tokens(result.stdout)
    assert len(same) == 4 and all(same.values()), result.stdout


def test_pcie_bench_example_checks_every_recall() -> None:
    result = _run_example("06_pcie_bench.py", "--device", "cpu", "--block-bytes", "16384", "--counts", "64",
                          "--peak-max-bytes", str(64 << 20))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "64 x 16 KiB: best" in result.stdout and "every recall bit-exact" in result.stdout, result.stdout
