"""`select_kernels._top`, the select kernel's threshold search, against its definition under TRITON_INTERPRET=1
(a child process, CPU machines only): rows that start the search past a shared prefix of the keys, and every
kind of need, each as one row and as a row and its tail (select_top_cases.py builds them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("select_top_cases.py")
ROOT = Path(__file__).resolve().parents[2]
NAMES = ("mixed-sign", "positive", "negative-max-norm", "narrow-range", "all-equal", "small-ages", "int32-ends",
         "one-member", "need-0", "need-all", "need-more-than-members", "no-members")


@pytest.fixture(scope="module")
def mismatches() -> dict:
    if torch.cuda.is_available():
        pytest.skip("interpreter tests are for CPU machines; the gpu tests cover the compiled kernel")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.needs_package("triton")
@pytest.mark.parametrize("name", [*NAMES, *(f"{n} (tail)" for n in NAMES)])
def test_top_equals_its_definition(mismatches: dict, name: str) -> None:
    assert name in mismatches and mismatches[name] == [], mismatches.get(name)
