"""Tiny random Hugging Face checkpoints written to disk with `transformers`, shared by the tests."""

from __future__ import annotations

from pathlib import Path

import torch

from pulseio_engine import Engine, SamplingParams
from pulseio_engine.request import Sequence
from pulseio_engine.scheduler import PrefillChunk

VOCAB = 256


def write_tiny_checkpoint(path: Path, arch: str, *, seed: int = 0, rope_scaling: bool = True):  # noqa: ANN201
    """Save a tiny random `arch` ('qwen3' | 'qwen2' | 'llama') model as safetensors; returns the HF model (fp32, eval).
    Llama gets Llama 3 rope scaling (original context 64, so it matters) unless `rope_scaling=False`."""
    transformers = __import__("transformers")
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "qwen3":
        # head_dim 32 != hidden / heads (16): the Qwen3 case
        config = transformers.Qwen3Config(head_dim=32, rope_theta=1e6, tie_word_embeddings=False, **common)
    elif arch == "qwen2":
        # q/k/v biases; tied embeddings as in Qwen2.5-0.5B
        config = transformers.Qwen2Config(rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                          tie_word_embeddings=True, **common)
    else:
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        if not rope_scaling:
            rope = {"rope_type": "default", "rope_theta": 10000.0}
        config = transformers.LlamaConfig(rope_parameters=rope, tie_word_embeddings=True, **common)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():   # peaked logits, so greedy choices are far from ties
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.15)
    model.eval()
    model.save_pretrained(path)
    return model


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:  # noqa: ANN001
    """Greedy continuation by full recomputation each step (no cache tricks to trust)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


def prefill_logits(engine: Engine, prompt: list[int], chunk: int) -> torch.Tensor:
    """All-position logits [n, V], prefilled in chunks of `chunk` tokens through the paged cache."""
    seq = Sequence(0, prompt, SamplingParams(max_new_tokens=1))
    seq.block_table.block_ids = engine.scheduler.allocator.allocate(-(-len(prompt) // engine.kv.block_size))
    rows = []
    for start in range(0, len(prompt), chunk):
        length = min(chunk, len(prompt) - start)
        state = engine.runner.prepare_prefill([PrefillChunk(seq, start, length)])
        state.logit_rows = None
        rows.append(engine.model.forward(state))
        seq.num_computed += length
    return torch.cat(rows)


def generate_like_transformers(gguf_path: Path, prompt: str, n: int, capsys, hf_gguf) -> dict:  # noqa: ANN001
    """Run `pulseio-engine generate --json` greedily on a .gguf and assert that its prompt ids and `n` new
    tokens equal those of `transformers` loading the same file (`hf_gguf`, the session's loader: its own GGUF
    reader and dequantization, fp32, CPU). Returns our JSON output."""
    import json

    from pulseio_engine.cli import main

    assert main(["generate", "--model", str(gguf_path), "--prompt", prompt, "--max-new-tokens", str(n),
                 "--device", "cpu", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    ref, tok = hf_gguf(gguf_path)
    ids = tok(prompt, return_tensors="pt").input_ids
    assert ours["prompt_ids"] == ids[0].tolist()
    ref.set_attn_implementation("sdpa")
    with torch.no_grad():
        out = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    assert ours["output_ids"] == out[0, ids.shape[1]:].tolist()
    return ours
