"""The torch.compile'd decode halves (on by default on CUDA) trace in one graph each and give the
eager path's tokens; a compiler failure falls back to eager and is reported, not hidden."""

from __future__ import annotations

import pytest

from pulseio_engine import Engine, SamplingParams

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10] * 13]


@pytest.mark.slow
def test_compiled_decode_matches_eager(tiny_qwen3) -> None:
    path, _ = tiny_qwen3
    sampling = SamplingParams(max_new_tokens=6, ignore_eos=True)
    eager = Engine.from_model(str(path), device="cpu", compile_decode=False).generate(PROMPTS, sampling)
    engine = Engine.from_model(str(path), device="cpu", compile_decode=True)
    compiled = engine.generate(PROMPTS, sampling)
    assert engine.model.compiled and engine.model.compile_error is None
    assert [o.output_ids for o in compiled] == [o.output_ids for o in eager]


def test_compile_failure_falls_back_to_eager_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine.from_model("tiny", device="cpu", compile_decode=False)
    expected = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3))[0].output_ids

    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("inductor: no C++ compiler")

    engine = Engine.from_model("tiny", device="cpu", compile_decode=False)
    engine.model._decode_halves = (broken, broken)
    with pytest.warns(UserWarning, match="torch.compile of the decode path failed"):
        out = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3))[0].output_ids
    assert out == expected
    assert engine.model.compile_error == "RuntimeError: inductor: no C++ compiler"
