"""Fixtures of the engine tests: tiny random Hugging Face checkpoints written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_models import write_tiny_checkpoint


@pytest.fixture(scope="session", params=["qwen3", "qwen2", "llama"])
def tiny_hf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """(path, transformers model) of a tiny random checkpoint, for each architecture."""
    path: Path = tmp_path_factory.mktemp(f"tiny_{request.param}")
    return path, write_tiny_checkpoint(path, request.param)


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    path: Path = tmp_path_factory.mktemp("tiny_qwen3_single")
    return path, write_tiny_checkpoint(path, "qwen3", seed=1)
