"""Models for the transformers-cache tests, built or loaded by transformers itself (not by our engine)."""

from __future__ import annotations

import weakref
from typing import Any

import torch

import pulseio

VOCAB = 256


def tiny_model(arch: str, *, layers: int = 4, seed: int = 0) -> Any:
    """A tiny random `arch` ('qwen3' | 'qwen2' | 'llama') decoder, fp32, eval, with peaked weights so greedy
    choices are far from ties. 4 query heads over 2 KV heads (GQA groups of 2)."""
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config = {"qwen3": lambda: transformers.Qwen3Config(head_dim=32, tie_word_embeddings=False, **common),
              "qwen2": lambda: transformers.Qwen2Config(tie_word_embeddings=True, **common),
              "llama": lambda: transformers.LlamaConfig(tie_word_embeddings=True, **common)}[arch]()
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.uniform_(0.5, 1.5) if "norm" in name else p.normal_(0.0, 0.15)
    return model.eval()


def greedy(model: Any, ids: torch.Tensor, n: int, cache: Any = None, attention: str = "sdpa",
           scores: bool = False) -> Any:
    """n greedy tokens after ids [1, T] with `cache` (None: transformers' default) and the attention
    implementation `attention` -> the new token ids (list), or (ids, per-step logits [n, V]) with scores."""
    from pulseio.integrations.transformers import cache_kwargs

    model.set_attn_implementation(attention)
    kwargs = {} if cache is None else cache_kwargs(model, cache)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, return_dict_in_generate=True, output_logits=scores, **kwargs)
    tokens = out.sequences[0, ids.shape[1]:].tolist()
    return (tokens, torch.cat(out.logits)) if scores else tokens


def prompt_ids(length: int, *, seed: int = 1, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def owned_tensors(root: Any) -> dict[int, int]:
    """Every tensor storage reachable from `root` through attributes, lists, tuples and dicts -> nbytes by
    address; pulseio's Runtime and DmaEngine are not entered (their own buffers are the footprint's
    'pulseio' part, measured on a GPU)."""
    storages: dict[int, int] = {}
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (pulseio.Runtime, pulseio.DmaEngine, weakref.ref, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in ("pulseio", "transformers"):
            stack.extend(vars(obj).values())
    return storages
