"""One GPU offload case in its own process (run by test_offload_gpu.py under a hard timeout): a tiny
checkpoint decoded by an offload-only engine on CUDA with each recall mode (eager, and the doorbell also
as CUDA-graph pieces), and by the all-on-GPU baseline. Prints one JSON line: each run's greedy tokens,
whether the host copy of the prompt equals a dense prefill's KV bit for bit, the bytes recalled, and the
recalls pulseio failed (its watchdog's expiries among them).

    python offload_gpu_case.py CHECKPOINT_DIR
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys

import torch

from pulseio_engine import CacheConfig, Engine, RetrievalHeads, SamplingParams
from pulseio_engine.config import DType, OffloadConfig, RecallMode, SchedulerConfig, SparseConfig, SparseMode
from pulseio_engine.kv.block_table import blocks_for

BS = 16
DEVICE = os.environ.get("CASE_DEVICE", "cuda")    # cpu: to check the case itself without a GPU
PROMPTS = [[(7 * i) % 251 for i in range(300)], [(3 + 5 * i) % 253 for i in range(133)]]


def run(path: str, mode: SparseMode, recall: RecallMode, graphs: bool = False) -> dict:
    offload = OffloadConfig(sparse=SparseConfig(mode=mode, token_budget=4 * BS, block_size=BS, local_blocks=1),
                            recall=recall, host_blocks=8192, max_seqs=2, dense_layers=1,
                            offload_only=recall is not RecallMode.ALL_ON_GPU)
    engine = Engine.from_model(path, device=DEVICE, dtype=DType.BFLOAT16,
                               cache=CacheConfig(block_size=BS, num_blocks=64), offload=offload, use_cuda_graphs=graphs,
                               scheduler=SchedulerConfig(max_prefill_tokens=128),
                               retrieval_heads=RetrievalHeads(2, best=(0,) * 3, worst=(1,) * 3))
    with engine:
        ids = [engine.add_request(p, SamplingParams(max_new_tokens=24, ignore_eos=True), offload=True)
               for p in PROMPTS]
        host_exact = None
        outputs = {}
        while engine.has_unfinished():
            for out in engine.step():
                outputs[out.request_id] = list(out.output_ids)
            if host_exact is None and engine.offloader.store is not None and engine.scheduler.running \
                    and all(s.num_computed >= s.prompt_len for s in engine.scheduler.running):
                host_exact = _host_matches_dense(path, engine)
        runtime = engine.offloader.runtime.statistics() if engine.offloader.runtime is not None else None
        return {"tokens": [outputs[i] for i in ids], "host_exact": host_exact,
                "bytes_recalled": engine.offloader.statistics().bytes_recalled,
                "failed": runtime.failed if runtime else 0, "expired": runtime.device_waits_expired if runtime else 0}


def _host_matches_dense(path: str, engine: Engine) -> bool:
    """The host copy of each prompt's offloaded layers equals a plain engine's prefilled cache."""
    dense = Engine.from_model(path, device=DEVICE, dtype=DType.BFLOAT16, cache=CacheConfig(block_size=BS),
                              use_cuda_graphs=False, scheduler=SchedulerConfig(max_prefill_tokens=128))
    for prompt in PROMPTS:
        dense.add_request(prompt, SamplingParams(max_new_tokens=2, ignore_eos=True))
    while dense.scheduler.waiting or any(s.num_computed < s.prompt_len for s in dense.scheduler.running):
        dense.step()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    store = engine.offloader.store
    for seq, oseq in zip(dense.scheduler.running, engine.offloader.seqs.values(), strict=True):
        n = seq.prompt_len
        ids = torch.tensor(seq.block_table.block_ids[:blocks_for(n, BS)], device=DEVICE)
        for layer in range(1, engine.kv.num_layers):
            k, v = store.read(oseq, layer - 1, n)
            dk, dv = dense.kv.gather(layer, ids, n)
            if not (torch.equal(k, dk) and torch.equal(v, dv)):
                return False
    return True


def main() -> None:
    faulthandler.dump_traceback_later(float(os.environ.get("CASE_DUMP_AFTER_S", "100")), exit=True)
    path = sys.argv[1]
    result = {f"{m.value}/{r.value}": run(path, m, r) for m in (SparseMode.QUEST, SparseMode.SOLOHEAD)
              for r in RecallMode}
    result.update({f"{m.value}/{RecallMode.DOORBELL.value}/graphs": run(path, m, RecallMode.DOORBELL, graphs=True)
                   for m in (SparseMode.QUEST, SparseMode.SOLOHEAD)})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
