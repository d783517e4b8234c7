"""A small workload for compute-sanitizer over pulseio's kernels: the copy kernels (zero_copy, the gather_dma
scatter), the publish kernel and the resident copy kernel, each run a few times with bytes checked.

    compute-sanitizer --tool memcheck  python benchmarks/sanitize_kernels.py
    compute-sanitizer --tool racecheck python benchmarks/sanitize_kernels.py

No device waits here: the sanitizer serializes kernels, and a stream that waits for the resident kernel
cannot run beside it then. Exits 1 if any recall landed wrong bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pulseio  # noqa: E402


def main() -> int:
    rng = np.random.default_rng(0)
    cfg = pulseio.RuntimeConfig(device="cuda", host_blocks=1024, device_slots=512, block_bytes=8192,
                                max_blocks_per_request=256, ring_slots=8, max_outstanding=64)
    wrong = 0
    with pulseio.open_runtime(cfg) as rt:
        rt.host_pool.blocks.copy_(torch.from_numpy(rng.integers(0, 256, rt.host_pool.blocks.shape, dtype=np.uint8)))
        for strategy in ("zero_copy", "gather_dma", "resident", "batched"):
            for k in (1, 64, 256):
                ids = rng.choice(1024, size=k, replace=False)
                slots = rng.choice(512, size=k, replace=False)
                how = pulseio.Strategy(strategy)
                rt.recall(host_ids=ids, device_slots=slots, strategy=how).wait(60)  # direct: a copy kernel
                torch.cuda.synchronize()
                wrong += int(not torch.equal(rt.device_pool.slots[torch.from_numpy(slots)].cpu(),
                                             rt.host_pool.blocks[torch.from_numpy(ids)]))
                gpu_ids, gpu_slots = torch.from_numpy(ids).cuda(), torch.from_numpy(slots).cuda()
                rt.post_recall(host_ids=gpu_ids, device_slots=gpu_slots, strategy=how).wait(60)  # the publish kernel
                torch.cuda.synchronize()
                wrong += int(not torch.equal(rt.device_pool.slots[torch.from_numpy(slots)].cpu(),
                                             rt.host_pool.blocks[torch.from_numpy(ids)]))
    print(f"sanitize workload: {wrong} wrong recalls")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
