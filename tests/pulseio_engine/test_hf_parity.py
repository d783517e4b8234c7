"""Our loader + model against `transformers` on tiny random checkpoints (fp32, CPU)."""

from __future__ import annotations

import torch
from hf_models import hf_greedy, prefill_logits

from pulseio_engine import CacheConfig, Engine, SamplingParams, SchedulerConfig

PROMPTS = [[5, 6, 7], list(range(10, 21)), list(range(30, 47)), [9, 3] * 17]


def test_logits_match_transformers(tiny_hf) -> None:
    path, hf = tiny_hf
    engine = Engine.from_model(str(path), device="cpu", cache=CacheConfig(block_size=4))
    prompt = list(range(3, 40))
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    for chunk in (len(prompt), 8):   # one prefill, and chunks attending to earlier cached chunks
        ours = prefill_logits(engine, prompt, chunk)
        rel = (ours - ref).abs().max() / ref.abs().max()
        assert rel <= 1e-4, f"chunk={chunk}: relative error {rel:.3g}"


def test_greedy_generation_matches_transformers(tiny_hf) -> None:
    """4 prompts of different lengths, 32 greedy tokens each, through paged KV (block 4), chunked
    prefill (8 tokens a step) and continuous batching (two requests join after the first two decode)."""
    path, hf = tiny_hf
    engine = Engine.from_model(str(path), device="cpu", cache=CacheConfig(block_size=4),
                               scheduler=SchedulerConfig(max_prefill_tokens=8))
    sampling = SamplingParams(max_new_tokens=32, ignore_eos=True)
    ids = [engine.add_request(p, sampling) for p in PROMPTS[:2]]
    outputs = {}
    for _ in range(8):
        outputs.update((o.request_id, o) for o in engine.step())
    assert engine.statistics().decode_tokens > 0, "the first requests should be decoding by now"
    ids += [engine.add_request(p, sampling) for p in PROMPTS[2:]]
    while engine.has_unfinished():
        outputs.update((o.request_id, o) for o in engine.step())
    for rid, prompt in zip(ids, PROMPTS, strict=True):
        assert list(outputs[rid].output_ids) == hf_greedy(hf, prompt, 32), f"prompt {rid}"
    assert engine.statistics().num_free_blocks == engine.kv.num_blocks - 1, "finished requests free their KV"


def test_sharded_checkpoint_loads_like_single_file(tiny_qwen3, tmp_path) -> None:
    path, hf = tiny_qwen3
    hf.save_pretrained(tmp_path, max_shard_size="200KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    prompt = list(range(3, 20))
    single = prefill_logits(Engine.from_model(str(path), device="cpu"), prompt, chunk=len(prompt))
    sharded = prefill_logits(Engine.from_model(str(tmp_path), device="cpu"), prompt, chunk=len(prompt))
    assert torch.equal(single, sharded)
