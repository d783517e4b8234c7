"""One RecallGraph case in a fresh process: python recall_graph_case.py LAYERS K REPLAYS cold|warm [split].

Captures one CUDA graph of LAYERS "layers", each: a selection kernel (ids and a device count derived from a
step counter the host bumps between replays; K = 1: every other replay's count is 0, a request of no blocks, which
lands as its publish stores it), `RecallGraph.post` (publish + captured device wait), and a
consumer that reads the recalled slots into an output buffer. Then REPLAYS times: bump the step, `arm()`,
replay, and check every layer's output bit for bit against the host pool and every Completion. "cold": the
consumer's kernels are first launched inside the capture; "warm": they ran once before it. The submitting
thread must never sync during the replays (torch's sync debug mode is set to error). "split": each layer is two
graphs, the selection with a publish-only post (`post(wait=False)`) and the consumer, replayed in order with the
host between them: on even layers `wait_device(layer)` (launched eagerly), on odd layers the host spins on the
armed Completion's done() and launches no wait (a landed recall needs none). Prints one JSON line;
exits 0 only if every replay landed bit-exact. A hang is the parent's to kill: faulthandler dumps every
thread's stack first.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

faulthandler.dump_traceback_later(float(os.environ.get("CASE_DUMP_AFTER_S", "100")), exit=True)


def main(layers: int, k: int, replays: int, temperature: str, split: bool = False) -> dict:
    import numpy as np
    import torch

    import pulseio

    cfg = pulseio.RuntimeConfig(device="cuda", host_blocks=8192, device_slots=layers * k + 1, block_bytes=8192,
                                max_blocks_per_request=k, device_wait_timeout_s=15.0)
    rng = np.random.default_rng(layers * 1000 + k)
    with pulseio.open_runtime(cfg) as rt:
        host = rt.host_pool.blocks.view(torch.int64)
        host.copy_(torch.from_numpy(rng.integers(-(2**62), 2**62, size=host.shape, dtype=np.int64)))
        pool = rt.device_pool.slots.view(torch.int64)                          # [slots, 1024]
        step = torch.zeros(1, dtype=torch.int64, device="cuda")
        outs = [torch.zeros((k, pool.shape[1]), dtype=torch.int64, device="cuda") for _ in range(layers)]
        stride = 7919                                                            # coprime to host_blocks
        stream = torch.cuda.Stream()

        def body(recalls: pulseio.RecallGraph | None) -> None:
            for layer in range(layers):
                base = (step * 613 + layer * 97) % cfg.host_blocks                  # [1]
                ids = (base + torch.arange(k, device="cuda") * stride) % cfg.host_blocks   # [K] distinct
                slots = 1 + layer * k + torch.arange(k, device="cuda")
                count = (k - (step + layer) % min(k + 1, 3)).reshape(1)              # decided on the device
                if recalls is not None:
                    recalls.post(host_ids=ids, device_slots=slots, count=count, tag=layer)
                outs[layer].copy_(pool.index_select(0, slots))                  # the consumer

        if temperature == "warm":
            with torch.cuda.stream(stream):
                body(None)
            torch.cuda.synchronize()
        recalls = rt.recall_graph()
        graph = torch.cuda.CUDAGraph()
        if split:
            pieces = _capture_split(torch, recalls, layers, k, cfg.host_blocks, stride, step, pool, outs, stream)
        else:
            with torch.cuda.graph(graph, stream=stream):
                body(recalls)
        torch.cuda.synchronize()
        results, t_host = [], 0.0
        torch.cuda.set_sync_debug_mode("error")
        for r in range(replays):
            with torch.cuda.stream(stream):
                step.fill_(r + 1)
                t0 = time.perf_counter()
                done = recalls.arm()
                if split:
                    _replay_split(recalls, pieces, done)
                else:
                    graph.replay()
                t_host += time.perf_counter() - t0
            torch.cuda.set_sync_debug_mode(0)
            stream.synchronize()
            got = [o.cpu() for o in outs]
            torch.cuda.set_sync_debug_mode("error")
            for layer in range(layers):
                base = ((r + 1) * 613 + layer * 97) % cfg.host_blocks
                ids = (base + np.arange(k) * stride) % cfg.host_blocks
                n = k - (r + 1 + layer) % min(k + 1, 3)
                want = host[torch.from_numpy(ids[:n])]
                ok = bool(torch.equal(got[layer][:n], want))
                landed = done[layer].wait(10) is done[layer] and done[layer].num_blocks == n
                results.append({"replay": r, "layer": layer, "ok": ok and landed and done[layer].tag == layer})
        torch.cuda.set_sync_debug_mode(0)
        stats = rt.statistics()
        return {"ok": all(x["ok"] for x in results), "bad": [x for x in results if not x["ok"]][:5],
                "host_us_per_replay": 1e6 * t_host / replays, "expired": stats.device_waits_expired,
                "submitted": stats.submitted, "completed": stats.completed}


def _capture_split(torch, recalls, layers, k, host_blocks, stride, step, pool, outs, stream) -> list:  # noqa: ANN001
    """Per layer: a graph selecting and publishing (no captured wait), and a graph consuming."""
    pieces = []
    for layer in range(layers):
        publish, consume = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        slots = 1 + layer * k + torch.arange(k, device="cuda")
        with torch.cuda.graph(publish, stream=stream):
            base = (step * 613 + layer * 97) % host_blocks
            ids = (base + torch.arange(k, device="cuda") * stride) % host_blocks
            count = (k - (step + layer) % min(k + 1, 3)).reshape(1)
            assert recalls.post(host_ids=ids, device_slots=slots, count=count, tag=layer, wait=False) == layer
        with torch.cuda.graph(consume, stream=stream):
            outs[layer].copy_(pool.index_select(0, slots))
        pieces.append((publish, consume, ids, count, slots))     # the tensors the graphs use stay alive
    return pieces


def _replay_split(recalls, pieces, done) -> None:  # noqa: ANN001
    for layer, (publish, consume, *_) in enumerate(pieces):
        publish.replay()
        if layer % 2 == 0:
            recalls.wait_device(layer)
        else:
            deadline = time.monotonic() + 20
            while not done[layer].done() and time.monotonic() < deadline:
                time.sleep(20e-6)
        consume.replay()


if __name__ == "__main__":
    out = main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:] == ["split"])
    print(json.dumps(out))
    sys.exit(0 if out["ok"] and out["expired"] == 0 else 1)
