"""Reuse pulseio's runtime in your own offloading code: a kernel picks blocks, the runtime recalls
them with no host sync, and an asyncio task awaits them.

    PYTHONPATH=. python examples/02_doorbell_recall.py          # GPU if torch sees one, else CPU

On a GPU the top-k runs on the device and its ids reach the poller through the doorbell ring (the
publish kernel); the consumer stream waits on the device, and the event loop gets the completion.
On a CPU-only machine the same code runs on HostBackend (a CPU thread stands in for the kernel).
"""

from __future__ import annotations

import torch

import pulseio

HOST_BLOCKS, SLOTS, K, STEPS = 1024, 64, 16, 8


async def decode(rt: pulseio.Runtime, device: str) -> None:
    digests = torch.randn(HOST_BLOCKS, 64, device=device)  # [HOST_BLOCKS, 64]: one digest per offloaded block
    slots = torch.arange(K, device=device)  # [K] int64: where recalled blocks land
    for step in range(STEPS):
        query = torch.randn(64, device=device)
        ids = torch.topk(digests @ query, K).indices  # [K] int64, on the device: the "selection kernel"
        done = rt.post_recall(host_ids=ids, device_slots=slots, tag=step)  # enqueues the publish; never waits
        if device == "cuda":
            done.device_wait()  # kernels enqueued after this run once the blocks have landed
        await done  # the event loop is woken by the interrupt pump
        landed = rt.device_pool.view(torch.float32, 2048)[:K, 0]
        expected = rt.host_pool.view(torch.float32, 2048)[ids.cpu(), 0]
        assert torch.equal(landed.cpu(), expected), "recalled blocks differ from the host copies"
        print(f"step {step}: recalled {done.num_blocks} blocks (seq {done.seq}) in "
              f"{(done.finished_ns - done.submitted_ns) / 1e3:.0f} us")


async def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = pulseio.RuntimeConfig(device=device, host_blocks=HOST_BLOCKS, device_slots=SLOTS, block_bytes=8192,
                                   ring_slots=16, max_blocks_per_request=K)
    async with pulseio.open_runtime(config) as rt:
        rt.host_pool.view(torch.float32, 2048)[:] = torch.randn(HOST_BLOCKS, 2048)
        await decode(rt, device)
        stats = rt.statistics()
        print(f"{stats.completed} recalls, {stats.bytes_moved >> 10} KiB, {stats.doorbell.wakeups} poller wake-ups, "
              f"post->landed p50 {stats.post_to_landed.p50_us:.0f} us on {rt.backend.name}")


if __name__ == "__main__":
    pulseio.run_async(main())  # uvloop when installed
