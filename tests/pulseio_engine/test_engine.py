"""Engine behaviour on CPU: KV handoff (disaggregated decode), refusals, presets, sampling."""

from __future__ import annotations

import json

import pytest
import torch

from pulseio_engine import (
    CacheConfig,
    Engine,
    FinishReason,
    KVBudgetError,
    KVHandoff,
    PromptTooLongError,
    RandomKV,
    SamplingParams,
    UnsupportedModelError,
)
from pulseio_engine.config import OffloadConfig, SparseConfig, SparseMode
from pulseio_engine.kv.block_table import blocks_for
from pulseio_engine.serving.testing import LateLoads


def test_decode_instance_continues_from_handed_in_kv(tiny_qwen3) -> None:
    """A prefill instance computes the prompt's KV and first token; a decode instance given that KV
    (and no prompt compute) produces the same continuation as running everything in one engine."""
    path, _ = tiny_qwen3
    prompt = list(range(20, 57))
    whole = Engine.from_model(str(path), device="cpu")
    expected = whole.generate([prompt], SamplingParams(max_new_tokens=12, ignore_eos=True))[0].output_ids

    prefill = Engine.from_model(str(path), device="cpu")
    prefill.add_request(prompt, SamplingParams(max_new_tokens=12, ignore_eos=True))
    prefill.step()
    seq = prefill.scheduler.running[0]
    blocks = torch.tensor(seq.block_table.block_ids[:blocks_for(len(prompt), prefill.kv.block_size)])
    handoff = KVHandoff(tuple(prefill.kv.gather(layer, blocks, len(prompt))
                              for layer in range(prefill.kv.num_layers)))

    decode = Engine.from_model(str(path), device="cpu", cache=CacheConfig(block_size=8))
    first = seq.output_ids[0]
    rid = decode.add_request(prompt + [first], SamplingParams(max_new_tokens=11, ignore_eos=True), kv=handoff)
    outputs = []
    while decode.has_unfinished():
        outputs += decode.step()
    assert outputs[0].request_id == rid
    assert decode.statistics().prefill_tokens == 0, "the decode instance computed no prompt"
    assert (first, *outputs[0].output_ids) == expected


@pytest.mark.parametrize("offload", [False, True], ids=["paged", "offload"])
def test_handed_in_kv_that_lands_late_changes_no_token(offload) -> None:
    """Handed-in KV loads beside the steps (`HandoffLoads`): a request whose load has not landed sits steps out while
    the others decode, or joins by a device wait when nothing else would run. Loads made to land after 1-4 checks
    (`LateLoads`) give every request the tokens of loads in stream order."""
    sampling = SamplingParams(max_new_tokens=6, ignore_eos=True)
    arrivals = {0: 0, 1: 0, 2: 2, 3: 5}                       # request -> the step before which it arrives
    runs = []
    for late in (False, True):
        quest = SparseConfig(mode=SparseMode.QUEST, token_budget=16, block_size=4, local_blocks=1)
        engine = Engine.from_model("tiny", device="cpu", cache=CacheConfig(block_size=4),
                                   offload=OffloadConfig(sparse=quest, max_seqs=4, dense_layers=1) if offload else None)
        if late:
            loads = engine.handoff_loads = LateLoads(torch.device("cpu"), max_checks=4, seed=3)
        out, step = {}, 0
        while step <= max(arrivals.values()) or engine.has_unfinished():
            for r in (r for r, at in arrivals.items() if at == step):
                length = 30 + 7 * r
                engine.add_request([(5 * r + i) % 200 for i in range(length)], sampling,
                                   kv=RandomKV(length - 1, seed=r), offload=offload)
            out.update({o.request_id: o.output_ids for o in engine.step()})
            step += 1
        engine.close()
        runs.append(out)
    assert runs[0] == runs[1] and len(runs[0]) == 4
    assert loads.held_checks > 0, "some request sat a step out while others decoded"
    assert loads.taken_early > 0, "the first requests joined by a device wait: nothing else could run"
    stats = loads.statistics()
    assert stats.landed + stats.waited == 4 and stats.waited >= loads.taken_early and stats.landed > 0


def test_random_kv_fills_only_the_requests_blocks() -> None:
    engine = Engine.from_model("tiny", device="cpu", cache=CacheConfig(num_blocks=8, block_size=4))
    engine.add_request([1] * 10, SamplingParams(max_new_tokens=2), kv=RandomKV(9, seed=3))
    engine.step()
    seq = engine.scheduler.running[0]
    assert len(seq.block_table) == 3
    for block in range(1, 8):   # block 0 is the padding block, scratch for warm-ups and padded rows
        touched = bool(engine.kv.kv[0][block].abs().sum() > 0)
        assert touched == (block in seq.block_table.block_ids), block


def test_prompt_beyond_model_limit_is_refused_before_work() -> None:
    engine = Engine.from_model("tiny", device="cpu", max_model_len=64)
    with pytest.raises(PromptTooLongError, match=r"prompt of 60 tokens \+ max_new_tokens 8 = 68 positions "
                                                 r"exceeds the model's limit of 64"):
        engine.add_request([1] * 60, SamplingParams(max_new_tokens=8))
    assert not engine.has_unfinished()


def test_prompt_beyond_kv_budget_is_refused_before_work() -> None:
    engine = Engine.from_model("tiny", device="cpu", cache=CacheConfig(num_blocks=4, block_size=16))
    with pytest.raises(KVBudgetError, match=r"needs 5 KV blocks of 16 tokens, but the KV cache holds 3 blocks"):
        engine.add_request([1] * 70, SamplingParams(max_new_tokens=8))
    assert not engine.has_unfinished()


def test_bad_token_ids_are_refused() -> None:
    engine = Engine.from_model("tiny", device="cpu")
    with pytest.raises(ValueError, match=r"prompt token ids must be in \[0, 256\), got \[999\]"):
        engine.add_request([1, 999])


def test_unsupported_architecture_names_what_it_found(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral",
                                                      "architectures": ["MistralForCausalLM"]}))
    with pytest.raises(UnsupportedModelError,
                       match=r"model_type 'mistral' \(architectures \['MistralForCausalLM'\]\) "
                             r"is not supported; supported model types: \['llama', 'qwen2', 'qwen3'\]"):
        Engine.from_model(str(tmp_path), device="cpu")


def test_unsupported_rope_and_unknown_model() -> None:
    from pulseio_engine.model.weights import model_config_from_hf

    base = {"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 8, "max_position_embeddings": 8}
    with pytest.raises(UnsupportedModelError, match="rope_type 'yarn' is not supported"):
        model_config_from_hf(base | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(UnsupportedModelError, match="attention_bias=True is not supported"):
        model_config_from_hf(base | {"attention_bias": True})
    with pytest.raises(UnsupportedModelError, match="neither a preset"):
        Engine.from_model("no-such-model", device="cpu")


def test_eos_stops_and_sampling_is_seeded() -> None:
    engine = Engine.from_model("tiny", device="cpu")
    greedy = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, ignore_eos=True))[0]
    engine.tokenizer.eos_token_ids = (greedy.output_ids[1],)
    stopped = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))[0]
    assert stopped.output_ids == greedy.output_ids[:2] and stopped.finish_reason is FinishReason.EOS
    hot = SamplingParams(max_new_tokens=6, temperature=5.0, ignore_eos=True)
    runs = [Engine.from_model("tiny", device="cpu", seed=7).generate([[1, 2]], hot)[0].output_ids for _ in range(2)]
    assert runs[0] == runs[1]


def test_a_decode_step_run_elsewhere_is_committed_and_a_request_can_leave_unfinished() -> None:
    """The serving loop's hooks: admit, commit_decode (plain decode steps only), release (blocks back)."""
    from pulseio_engine.kv.handoff import RandomKV

    engine = Engine.from_model("tiny", device="cpu")
    free = engine.scheduler.allocator.num_free
    a = engine.add_request(list(range(1, 40)), SamplingParams(max_new_tokens=2, ignore_eos=True), kv=RandomKV(38))
    b = engine.add_request(list(range(1, 20)), SamplingParams(max_new_tokens=3, ignore_eos=True))
    assert [s.request_id for s in engine.admit()] == [a, b]
    seq_a, seq_b = engine.sequence(a), engine.sequence(b)
    with pytest.raises(ValueError, match=rf"^request {b} is not decoding its last token"):
        engine.commit_decode([seq_b], [7])                       # b still needs its prefill
    assert engine.commit_decode([seq_a], [7]) == [] and seq_a.output_ids == [7]
    assert [o.output_ids for o in engine.commit_decode([seq_a], [9])] == [(7, 9)]
    released = engine.release(b)
    assert released is seq_b and not engine.has_unfinished()
    assert engine.scheduler.allocator.num_free == free
    with pytest.raises(KeyError, match=f"request {b} is not waiting or running"):
        engine.sequence(b)
