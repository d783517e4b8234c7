"""Calibration: middle-attention mass against a loop, the dense forward against transformers'
attention probabilities, head ranking and its stability."""

from __future__ import annotations

import pytest
import torch

from pulseio_engine import Engine
from pulseio_engine.calibration import (
    CalibrationConfig,
    CalibrationError,
    CalibrationPrompt,
    calibration_prompts,
    head_middle_mass,
    middle_mass,
    rank_heads,
    retrieval_prompts,
    text_prompts,
)
from pulseio_engine.kv.retrieval_heads import RetrievalHeads


def _ref_middle_mass(probs: torch.Tensor, config: CalibrationConfig, first: int | None = None) -> list[float]:
    h, t, _ = probs.shape
    if first is None:
        first = max(int(t * config.decode_fraction), config.sink_tokens + config.local_tokens)
    out = []
    for head in range(h):
        per_pos = [sum(float(probs[head, pos, j]) for j in range(config.sink_tokens, pos - config.local_tokens + 1))
                   for pos in range(first, t)]
        out.append(sum(per_pos) / len(per_pos))
    return out


@pytest.mark.parametrize("config", [CalibrationConfig(sink_tokens=2, local_tokens=3),
                                    CalibrationConfig(sink_tokens=0, local_tokens=1, decode_fraction=0.0)])
def test_middle_mass_matches_a_loop(config: CalibrationConfig) -> None:
    logits = torch.randn((3, 20, 20), generator=torch.Generator().manual_seed(0))
    probs = logits.masked_fill(~torch.ones(20, 20, dtype=torch.bool).tril(), -torch.inf).softmax(-1)
    torch.testing.assert_close(middle_mass(probs, config), torch.tensor(_ref_middle_mass(probs, config)))
    torch.testing.assert_close(middle_mass(probs, config, 17), torch.tensor(_ref_middle_mass(probs, config, 17)))


def test_dense_forward_has_the_attention_of_transformers(tiny_hf) -> None:  # noqa: ANN001
    """Our calibration forward's per-head masses equal those computed from transformers' eager attention
    probabilities, for every layer (Llama, Qwen2, Qwen3 tiny checkpoints)."""
    path, hf = tiny_hf
    model = Engine.from_model(str(path), device="cpu").model
    config = CalibrationConfig(sink_tokens=2, local_tokens=4)
    ids = torch.arange(3, 43)
    ours = head_middle_mass(model, ids, config)                                 # [L, Hkv]
    hf.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = hf(ids[None], output_attentions=True).attentions          # L x [1, Hq, T, T]
    group = model.config.num_heads // model.config.num_kv_heads
    want = torch.stack([middle_mass(a[0], config).view(-1, group).mean(1) for a in attentions])
    torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-5)


def test_rank_heads_and_stability() -> None:
    masses = torch.tensor([[[0.1, 0.5, 0.2], [0.3, 0.1, 0.0]],
                           [[0.2, 0.4, 0.1], [0.0, 0.2, 0.4]],
                           [[0.1, 0.6, 0.3], [0.4, 0.2, 0.0]],
                           [[0.3, 0.3, 0.0], [0.0, 0.3, 0.5]]])          # [P=4, L=2, Hkv=3]
    heads = rank_heads(masses)
    # means: layer 0 [0.175, 0.45, 0.15], layer 1 [0.175, 0.2, 0.225]
    assert heads.best == (1, 2) and heads.worst == (2, 0)
    # even prompts: best (1, 0), worst (0, 2); odd prompts: best (1, 2), worst (2, 0)
    assert heads.extra["agreement_best"] == 0.5 and heads.extra["agreement_worst"] == 0.0
    assert rank_heads(torch.zeros((2, 1, 3))).best == (0,), "ties go to the lower head"
    assert RetrievalHeads.from_json(heads.to_json()) == heads
    with pytest.raises(CalibrationError, match=r"^rank_heads needs at least 2 prompts to measure stability, got 1$"):
        rank_heads(masses[:1])


def test_calibration_prompts_and_windows() -> None:
    assert calibration_prompts(list(range(10)), 3, 4) == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    with pytest.raises(CalibrationError, match=r"has 3 tokens, fewer than one prompt of 4"):
        calibration_prompts([1, 2, 3], 2, 4)
    with pytest.raises(CalibrationError, match=r"prompts of 40 tokens leave no decode position"):
        CalibrationConfig(sink_tokens=16, local_tokens=32).first_position(40)


def _chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_retrieval_prompts_put_a_fact_in_the_middle_and_measure_its_answer() -> None:
    """Character-level tokens, so the prompt reads back as text: each prompt is a window of the text with
    one fact inside, then its question; the ids end one token short of the answer, and the decode positions
    (from `decode_from` on) are exactly those predicting the answer's tokens. The fact lies past the sink
    window and before the local window of the first decode position; prompts are reproducible."""
    text = "".join(f"line {i} of the play, spoken softly. " for i in range(400))
    config = CalibrationConfig(sink_tokens=16, local_tokens=32)
    prompts = retrieval_prompts(_chars(text), _chars, 5, 400, config)
    assert prompts == retrieval_prompts(_chars(text), _chars, 5, 400, config)
    assert prompts != retrieval_prompts(_chars(text), _chars, 5, 400, config, seed=1)
    depths = set()
    for p in prompts:
        assert len(p.ids) <= 400
        s = "".join(map(chr, p.ids))
        fact_at = s.index(" Remember this: the password of the ")
        gate, value = s[fact_at:].split(" gate is ", 1)[0].split()[-1], s[fact_at:].split(" gate is ", 1)[1][:6]
        question = f" What is the password of the {gate} gate? The password of the {gate} gate is"
        assert s[: p.decode_from + 1].endswith(question)
        answer = f" {value}"
        assert s[p.decode_from + 1:] == answer[:-1], "the positions from decode_from predict the answer's tokens"
        fact_end = s.index(".", fact_at + 30) + 1
        assert config.sink_tokens <= fact_at and fact_end - 1 <= p.decode_from - config.local_tokens
        assert (s[:fact_at] + s[fact_end:].split(question)[0]) in text, "the rest is one window of the text"
        depths.add(fact_at)
    assert len(depths) > 1
    with pytest.raises(CalibrationError, match=r"retrieval prompts of 150 tokens leave \d+ for the text around"):
        retrieval_prompts(_chars(text), _chars, 2, 150, config)


def test_text_prompts_measure_the_second_half() -> None:
    config = CalibrationConfig(sink_tokens=2, local_tokens=3)
    assert text_prompts(list(range(10)), 2, 8, config) == [CalibrationPrompt([0, 1, 2, 3, 4, 5, 6, 7], 5),
                                                            CalibrationPrompt([2, 3, 4, 5, 6, 7, 8, 9], 5)]
