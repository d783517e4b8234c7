"""Triton kernels' tests under TRITON_INTERPRET=1 on a CPU. The interpreter must be on before Triton is first
imported, so a test file runs itself as a child process with it set (`interpreted_results`, in a module-scoped
fixture); the child runs every case (`run_cases`) and prints their results as one JSON line, a case that raised
reported as {"error": ...} for its test to fail with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def interpreted_results(script: str | Path, *, timeout_s: float = 300) -> dict:
    """Run `script` (the test file) in a child with the interpreter on; -> its JSON line. Skips on a CUDA machine,
    where the gpu tests cover the compiled kernels."""
    if torch.cuda.is_available():
        pytest.skip("interpreter tests are for CPU machines; the gpu tests cover the compiled kernel")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, str(script)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_cases(runs: Iterable[tuple[str, Callable[..., Any], tuple]]) -> None:
    """In the child: each (name, function, arguments) run in turn, and the results printed as one JSON line."""
    results = {}
    for name, run, args in runs:
        try:
            results[name] = run(*args)
        except Exception as exc:  # reported to the parent test, which fails with it
            results[name] = {"error": repr(exc)}
    print(json.dumps(results))
