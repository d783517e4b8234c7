"""Put pulseio under your own offloading code, with its public contract only.

Your system already has two things: a place where the KV of every layer lives in host memory, and a policy
that decides what comes back to the GPU. Below, `MyOffloader` keeps its policy and hands every copy to a
pulseio Runtime: whole layers fetched ahead with host-chosen ids (`Runtime.recall`: your scheduler knows
what comes next), and the top-k blocks of a layer chosen by a kernel on the device (`Runtime.post_recall`:
the ids never visit the host). Both return a Handle: `device_wait()` orders later kernels after the copy
without a host sync, `wait()` / `done()` / `await` serve host code. Every recalled byte is checked against
the host copy.

    python examples/04_your_offloader.py [--device cpu|cuda] [--layers 4] [--steps 3]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import pulseio

BLOCK_TOKENS, KV_HEADS, HEAD_DIM = 16, 2, 64  # one block: [2, KV_HEADS, BLOCK_TOKENS, HEAD_DIM] fp32 = 16 KiB


class MyOffloader:
    """Layer l's KV is host blocks [l * per_layer, (l + 1) * per_layer); the device has two layer buffers
    (the layer in use and the next one, alternating from layer to layer) and a hot area of `top_k` slots for
    sparse recalls."""

    def __init__(self, rt: pulseio.Runtime, layers: int, per_layer: int, top_k: int) -> None:
        self.rt, self.layers, self.per_layer, self.top_k = rt, layers, per_layer, top_k
        self.kv_host = rt.host_pool.view(torch.float32, 2, KV_HEADS, BLOCK_TOKENS, HEAD_DIM)   # [blocks, ...]
        self.kv_device = rt.device_pool.view(torch.float32, 2, KV_HEADS, BLOCK_TOKENS, HEAD_DIM)
        self.hot = torch.arange(2 * per_layer, 2 * per_layer + top_k, device=rt.device_pool.slots.device)

    def buffer_slots(self, buffer: int) -> np.ndarray:
        """Device slots of layer buffer 0 or 1: [per_layer] int64, host."""
        return np.arange(self.per_layer) + buffer * self.per_layer

    def fetch_layer(self, layer: int, buffer: int) -> pulseio.Handle:
        """Whole layer into a buffer, ids chosen here on the host; returns at once. The copy runs behind the
        work already on the current stream, which may still read the buffer's previous layer: issue it after
        that layer's last kernel, not before (two copies in flight into one buffer are not ordered either)."""
        host_ids = np.arange(self.per_layer) + layer * self.per_layer
        return self.rt.recall(host_ids=host_ids, device_slots=self.buffer_slots(buffer))

    def fetch_top_k(self, layer: int, scores: torch.Tensor) -> pulseio.Handle:
        """The top_k blocks of `layer` by `scores` ([per_layer], on the device) into the hot area: the ids are
        picked by a kernel and published from the device, so nothing waits for them on the host."""
        ids = torch.topk(scores, self.top_k).indices + layer * self.per_layer     # [top_k] int64, device
        return self.rt.post_recall(host_ids=ids, device_slots=self.hot, tag=layer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    per_layer, top_k = 32, 8
    block_bytes = 2 * KV_HEADS * BLOCK_TOKENS * HEAD_DIM * 4
    config = pulseio.RuntimeConfig(device=args.device, host_blocks=args.layers * per_layer,
                                   device_slots=2 * per_layer + top_k, block_bytes=block_bytes,
                                   max_blocks_per_request=per_layer)
    with pulseio.open_runtime(config) as rt:
        me = MyOffloader(rt, args.layers, per_layer, top_k)
        me.kv_host.copy_(torch.randn(me.kv_host.shape))                           # the KV your system wrote
        dev = rt.device_pool.slots.device
        ahead, visit = me.fetch_layer(0, buffer=0), 0
        for step in range(args.steps):
            for layer in range(args.layers):
                buffer = torch.from_numpy(me.buffer_slots(visit % 2)).to(dev)
                ahead.device_wait()                                    # this layer's buffer, on the device
                scores = me.kv_device[buffer, 0].float().mean((1, 2, 3))          # [per_layer]: your policy
                ahead_next = me.fetch_layer((layer + 1) % args.layers, buffer=(visit + 1) % 2)  # behind `scores`
                sparse = me.fetch_top_k(layer, scores)
                sparse.device_wait()
                picked = torch.topk(scores, top_k).indices.cpu() + layer * per_layer
                assert torch.equal(me.kv_device[me.hot].cpu(), me.kv_host[picked]), "top-k blocks differ"
                layer_ids = torch.arange(per_layer) + layer * per_layer
                assert torch.equal(me.kv_device[buffer].cpu(), me.kv_host[layer_ids]), "layer differs"
                print(f"step {step} layer {layer}: layer of {per_layer} blocks and top-{top_k} recalled, bit-exact "
                      f"({sparse.wait().num_blocks} blocks through the doorbell)")
                ahead, visit = ahead_next, visit + 1
        ahead.wait()
        stats = rt.statistics()
        print(f"{stats.completed} recalls, {stats.bytes_moved >> 10} KiB moved on {rt.backend.name}; "
              f"failed: {stats.failed}")


if __name__ == "__main__":
    main()
