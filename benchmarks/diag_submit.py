"""Where the host time of one small zero-copy recall goes: the CUDA calls alone, then a cProfile of
the engine's sustained loop (main thread). Prints figures and the top of the profile."""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import numpy as np
import torch

import pulseio
from pulseio import DmaConfig, Strategy
from pulseio._cuda.launch import BlockArray, CopyBlocksLauncher
from pulseio.bench.timing import median_latency_us, sustained_seconds


def _us(fn, reps: int = 2000) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e6


def main() -> None:
    backend = pulseio.open_backend("cuda")
    bb, count = 8 << 10, 64
    host = pulseio.HostPool(backend, (256 << 20) // bb, bb)
    device = pulseio.DevicePool(backend, 4096, bb)
    rng = np.random.default_rng(0)
    stream = torch.cuda.Stream()
    launcher = CopyBlocksLauncher(max_ctas=132)
    ids = torch.zeros(count, dtype=torch.int64, device="cuda")
    pool = BlockArray(device.device_ptr, device.num_slots, bb)
    print(f"launch of an empty copy kernel: {_us(lambda: launcher(stream.cuda_stream, pool, ids.data_ptr(), pool, ids.data_ptr(), 0)):.2f} us")
    stream.synchronize()
    print(f"torch Event() + record: {_us(lambda: torch.cuda.Event().record(stream)):.2f} us")
    event = torch.cuda.Event()
    event.record(stream)
    event.synchronize()
    print(f"event.query (done): {_us(event.query):.2f} us")
    print(f"event.synchronize (done): {_us(event.synchronize):.2f} us")
    plan_ids = rng.choice(host.num_blocks, count, replace=False)
    plan_slots = rng.permutation(device.num_slots)[:count]
    pulseio.plan.make_plan(pulseio.Direction.H2D, plan_ids, plan_slots, num_host_blocks=host.num_blocks,
                           num_device_slots=device.num_slots, block_bytes=bb)  # compile
    print(f"make_plan 64: {_us(lambda: pulseio.plan.make_plan(pulseio.Direction.H2D, plan_ids, plan_slots, num_host_blocks=host.num_blocks, num_device_slots=device.num_slots, block_bytes=bb)):.2f} us")
    with pulseio.DmaEngine(host, device, DmaConfig(merge_blocks=count, zero_copy_ctas=132)) as engine:
        idl = [rng.choice(host.num_blocks, count, replace=False) for _ in range(8)]
        sl = [rng.permutation(device.num_slots)[:count] for _ in range(8)]

        def submit(i: int) -> pulseio.Transfer:
            return engine.recall(idl[i % 8], sl[i % 8], strategy=Strategy.ZERO_COPY, stream_ordered=False)

        for i in range(50):
            submit(i).wait()
        t0 = time.perf_counter()
        transfers = [submit(i) for i in range(12)]
        t1 = time.perf_counter()
        for t in transfers:
            t.wait()
        print(f"12 submits: {(t1 - t0) / 12 * 1e6:.2f} us each; waits {(time.perf_counter() - t1) / 12 * 1e6:.2f} us each")
        print(f"sustained w8: {sustained_seconds(submit, 2000, 8) * 1e6:.2f} us/transfer; "
              f"latency p50 {median_latency_us(submit, 200):.2f} us")
        profile = cProfile.Profile()
        profile.enable()
        sustained_seconds(submit, 2000, 8)
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
        print(text.getvalue())
    host.close()


if __name__ == "__main__":
    main()
