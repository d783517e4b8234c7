"""Every example runs as a user would run it, on the CPU backend, and does what it says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
