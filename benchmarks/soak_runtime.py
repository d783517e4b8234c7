"""GPU soak of the doorbell runtime: no hang, no wrong byte, statistics that add up.

    PYTHONPATH=. python benchmarks/soak_runtime.py --seconds 130 --min-posts 10000 --out soak.json

Steps, until both the time and the post count are reached: ids and slots chosen on the GPU, random k
(log-uniform 1..2048), a random strategy, one of two consumer streams, post_recall, device_wait, a random
consumer pattern (`pulseio.testing.consumers`, the cheap ones most of the time), empty_cache() now and
then; each step's gathered slots are checked bit for bit against the host pool. Meanwhile a second
thread sends direct recalls (host ids, `Runtime.recall`) into other slots and checks them too.
Prints a summary and writes every counter to --out; exits 1 on any hang (the step watchdog), wrong
byte or mismatched statistics.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pulseio  # noqa: E402
from pulseio.bench.records import git_sha  # noqa: E402
from pulseio.testing.consumers import PATTERNS  # noqa: E402

STRATEGIES = ["resident", "zero_copy", "gather_dma", "batched", "auto"]
CHEAP = ["item", "pinned_poll", "cpu", "wait_then_item"]  # most steps; the rest one step in RARE_EVERY
RARE = ["synchronize", "empty_cache", "alloc_growth", "pinned_alloc", "graph", "triton"]
RARE_EVERY = 25


def direct_traffic(rt: pulseio.Runtime, stop: threading.Event, counts: dict, rng: np.random.Generator) -> None:
    """Direct recalls into slots 6144..8191 (the doorbell steps use 0..4095), each checked."""
    host = rt.host_pool.blocks
    while not stop.is_set():
        k = int(rng.integers(1, 256))
        ids = rng.choice(rt.host_pool.num_blocks, size=k, replace=False)
        slots = 6144 + rng.choice(2048, size=k, replace=False)
        t = rt.recall(host_ids=ids, device_slots=slots, strategy=pulseio.Strategy(STRATEGIES[int(rng.integers(0, 5))]))
        t.wait(60)
        got = rt.device_pool.slots[torch.from_numpy(slots).to("cuda")].cpu()
        counts["direct"] += 1
        counts["direct_wrong"] += int(not torch.equal(got, host[torch.from_numpy(ids)]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=130)
    parser.add_argument("--min-posts", type=int, default=10_000)
    parser.add_argument("--out", default="soak.json")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.seconds + 120, exit=True)  # a hang: every thread's stack, then exit
    rng = np.random.default_rng(0)
    cfg = pulseio.RuntimeConfig(device="cuda", host_blocks=32768, device_slots=8192, block_bytes=8192,
                                max_blocks_per_request=2048, ring_slots=64, device_wait_timeout_s=30.0)
    counts = {"posts": 0, "wrong": 0, "failed": 0, "direct": 0, "direct_wrong": 0, "empty_cache": 0}
    by_pattern: dict[str, int] = {}
    by_strategy: dict[str, int] = {}
    start = time.monotonic()
    with pulseio.open_runtime(cfg) as rt:
        host = rt.host_pool.blocks.view(torch.int64)
        host.copy_(torch.from_numpy(rng.integers(-(2**62), 2**62, size=host.shape, dtype=np.int64)))
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        stop = threading.Event()
        side = threading.Thread(target=direct_traffic, args=(rt, stop, counts, np.random.default_rng(1)), daemon=True)
        side.start()
        step = 0
        while time.monotonic() - start < args.seconds or counts["posts"] < args.min_posts:
            k = int(np.exp(rng.uniform(0, np.log(2048))))
            strategy, stream = STRATEGIES[int(rng.integers(0, 5))], streams[step % 2]
            rare = step % RARE_EVERY == 0
            pattern = RARE[int(rng.integers(0, len(RARE)))] if rare else CHEAP[int(rng.integers(0, len(CHEAP)))]
            with torch.cuda.stream(stream):  # chosen on the GPU, as a selection kernel would
                ids = torch.randperm(cfg.host_blocks, device="cuda")[:k]
                slots = torch.randperm(4096, device="cuda")[:k]
            done = rt.post_recall(host_ids=ids, device_slots=slots, stream=stream, tag=step,
                                  strategy=pulseio.Strategy(strategy))
            done.device_wait(stream)
            out = PATTERNS[pattern](done, rt.device_pool.slots, slots, stream)
            stream.synchronize()
            try:
                done.wait(60)
            except pulseio.PulseError:
                counts["failed"] += 1
            counts["wrong"] += int(not torch.equal(out.cpu(), rt.host_pool.blocks[ids.cpu()]))
            counts["posts"] += 1
            by_pattern[pattern] = by_pattern.get(pattern, 0) + 1
            by_strategy[strategy] = by_strategy.get(strategy, 0) + 1
            if step % 97 == 0:
                torch.cuda.empty_cache()
                counts["empty_cache"] += 1
            step += 1
        stop.set()
        side.join(60)
        stats = rt.statistics()
    seconds = time.monotonic() - start
    adds_up = stats.submitted == stats.completed + stats.failed and stats.in_flight == 0
    ok = counts["wrong"] == 0 and counts["failed"] == 0 and counts["direct_wrong"] == 0 and adds_up
    result = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now().isoformat(),
              "git_sha": git_sha(), "seconds": seconds, **counts, "by_pattern": by_pattern,
              "by_strategy": by_strategy, "statistics": {k: v for k, v in vars(stats).items() if isinstance(v, int)},
              "statistics_add_up": adds_up, "ok": ok}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
