"""Shared pytest setup: `gpu` tests are skipped, saying why, where torch sees no CUDA device."""

from __future__ import annotations

import os

import pytest

# Before torch starts CUDA: kernels first launched while a stream waits on a pulseio completion word
# deadlock under lazy module loading (seen on the H200); tests load every module up front.
os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")


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
