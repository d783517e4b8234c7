"""Shared pytest setup: `gpu` tests are skipped, saying why, where torch sees no CUDA device."""

from __future__ import annotations

import os

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    import torch

    build = "this torch is a CPU-only build" if torch.version.cuda is None else "torch sees no GPU"
    skip_gpu = pytest.mark.skip(reason=f"needs a CUDA GPU ({build})")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# Triton's bindings (nanobind) print a "leaked N instances/types/functions" report at interpreter exit,
# after the test summary, because Triton keeps module-level objects alive until then; it reads like a
# failure and is not one. Once pytest is done (at exit: pytest restores its captured stderr after the
# unconfigure hooks), stderr goes through a filter that drops exactly those report lines and passes
# everything else (a real error at shutdown still shows). PULSEIO_SHOW_NANOBIND_LEAKS=1 keeps them.
_NANOBIND_FILTER = r"""
import sys
report = ("nanobind: leaked ", " - leaked ", " - ... skipped remainder", "nanobind: this is likely caused",
          "See https://nanobind.readthedocs.io/en/latest/refleaks.html")
for line in sys.stdin:
    if not line.startswith(report):
        sys.stderr.write(line)
        sys.stderr.flush()
"""


def pytest_unconfigure(config: pytest.Config) -> None:
    import atexit

    atexit.register(_filter_nanobind_leak_report)


def _filter_nanobind_leak_report() -> None:
    import subprocess
    import sys

    if "triton" not in sys.modules or os.environ.get("PULSEIO_SHOW_NANOBIND_LEAKS"):
        return
    sys.stderr.flush()
    read, write = os.pipe()
    subprocess.Popen([sys.executable, "-c", _NANOBIND_FILTER], stdin=read, stderr=os.dup(2), close_fds=True)
    os.close(read)
    os.dup2(write, 2)
    os.close(write)
