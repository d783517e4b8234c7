"""One device-wait case in a fresh process:
python device_wait_case.py PATTERN STRATEGY K cold|warm [DEPTH [last|interleaved]].

Opens a runtime, then for 3 steps: GPU-held ids and slots, DEPTH (default 1) requests in a chain (each
post_recall and device_wait on the consumer stream, so each publish runs only once the request before it
has landed: an engine's layers), the consumer pattern (`pulseio.testing.consumers`) behind the last wait
("last", the default) or behind each wait, before the next request's publish ("interleaved": an engine's
layer between two recalls), and a bit-exact check of what the consumer read of every request.
"cold": nothing but the runtime's own setup ran on the GPU before the first post (the consumer's kernels
are launched for the first time behind the wait); "warm": the pattern ran once on other slots first.
Prints one JSON line; exits 0 only if every step landed bit-exact. A hang is the parent's to kill:
faulthandler dumps every thread's stack first.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

faulthandler.dump_traceback_later(float(os.environ.get("CASE_DUMP_AFTER_S", "100")), exit=True)


def main(pattern: str, strategy_name: str, k: int, temperature: str, depth: int = 1, placement: str = "last") -> dict:
    import numpy as np
    import torch

    import pulseio
    from pulseio.testing.consumers import PATTERNS

    consume = PATTERNS[pattern]
    block = 8192
    cfg = pulseio.RuntimeConfig(device="cuda", host_blocks=16384, device_slots=8192, block_bytes=block,
                                max_blocks_per_request=2048, strategy=pulseio.Strategy(strategy_name),
                                device_wait_timeout_s=float(os.environ.get("CASE_WAIT_TIMEOUT_S", "60")))
    rng = np.random.default_rng(k * 7919 + len(pattern))
    with pulseio.open_runtime(cfg) as rt:
        host = rt.host_pool.blocks.view(torch.int64)
        host.copy_(torch.from_numpy(rng.integers(-(2**62), 2**62, size=host.shape, dtype=np.int64)))
        pool = rt.device_pool.slots
        stream = torch.cuda.Stream()
        if temperature == "warm":
            warm_slots = torch.arange(4096, 4096 + k).to("cuda")
            consume(None, pool, warm_slots, stream)
            torch.cuda.synchronize()
        steps = []
        for step in range(3):
            ids_np = rng.choice(cfg.host_blocks, size=depth * k, replace=False).astype(np.int64)
            slots_np = rng.choice(4096, size=depth * k, replace=False).astype(np.int64)
            ids, slots = torch.from_numpy(ids_np).to("cuda"), torch.from_numpy(slots_np).to("cuda")  # copies only
            t0 = time.perf_counter()
            chain, outs = [], []
            for d in range(depth):
                done = rt.post_recall(host_ids=ids[d * k:(d + 1) * k], device_slots=slots[d * k:(d + 1) * k],
                                      stream=stream, tag=step * depth + d)
                done.device_wait(stream)
                chain.append(done)
                if placement == "interleaved":
                    outs.append(consume(done, pool, slots[d * k:(d + 1) * k], stream))
            if placement == "interleaved":
                with torch.cuda.stream(stream):  # the outs are the consumer stream's: join them in its order
                    out = torch.cat(outs)
            else:
                out = consume(done, pool, slots, stream)
            stream.synchronize()
            errors = []
            for done in chain:
                done.wait(60)
                errors += [repr(done.exception())] if done.exception() else []
            exact = bool(torch.equal(out.cpu(), rt.host_pool.blocks[torch.from_numpy(ids_np)]))
            steps.append({"step": step, "exact": exact, "ms": round(1e3 * (time.perf_counter() - t0), 3),
                          "errors": errors})
        stats = rt.statistics()
    return {"pattern": pattern, "strategy": strategy_name, "k": k, "temperature": temperature, "depth": depth,
            "placement": placement, "loading": os.environ.get("CUDA_MODULE_LOADING", "<unset>"),
            "steps": steps, "ok": all(s["exact"] and not s["errors"] for s in steps), "completed": stats.completed,
            "failed": stats.failed, "expired": stats.device_waits_expired,
            "submitted": stats.submitted}


if __name__ == "__main__":
    result = main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], *map(int, sys.argv[5:6]), *sys.argv[6:7])
    print(json.dumps(result), flush=True)
    sys.exit(0 if result["ok"] and result["failed"] == 0 else 1)
