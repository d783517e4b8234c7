"""The transfer example runs as a user would run it, on the CPU backend, and checks its own bytes."""

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
