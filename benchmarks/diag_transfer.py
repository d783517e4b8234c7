"""Where a transfer's time goes on this machine: CPU gather rate (main vs worker thread, and the
variants that might close the gap), one DMA, the copy kernel's launch cost and its GPU-only rate per
CTA budget, and the engine's per-transfer rate and latency. Prints one line per figure; `--json`
keeps them."""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np
import torch

import pulseio
from pulseio import DmaConfig, Strategy


def _rate(nbytes: int, fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return nbytes * reps / (time.perf_counter() - t0) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    out: dict[str, float] = {"torch_threads": torch.get_num_threads()}
    backend = pulseio.open_backend("cuda")
    bb = 8 << 10
    host = pulseio.HostPool(backend, (2 << 30) // bb, bb)
    host.blocks.random_(0, 255)
    device = pulseio.DevicePool(backend, 8192, bb)
    staging = backend.alloc_host(4096 * bb, label="diag staging")
    dev = torch.empty(4096 * bb, dtype=torch.uint8, device="cuda")
    rng = np.random.default_rng(0)
    for count in (64, 512, 4096):
        ids = torch.from_numpy(rng.choice(host.num_blocks, count, replace=False))
        words = host.blocks.view(torch.int64)
        dst = staging.tensor[: count * bb].view(count, bb).view(torch.int64)
        out[f"gather_main_{count}_gbps"] = _rate(count * bb, lambda: torch.index_select(words, 0, ids, out=dst))
        res: list[float] = []
        th = threading.Thread(target=lambda: res.append(
            _rate(count * bb, lambda: torch.index_select(words, 0, ids, out=dst))))
        th.start()
        th.join()
        out[f"gather_worker_{count}_gbps"] = res[0]
        res.clear()

        def worker_with_threads(res=res, dst=dst, ids=ids, count=count) -> None:
            torch.set_num_threads(torch.get_num_threads())  # this thread's own OpenMP setting
            res.append(_rate(count * bb, lambda: torch.index_select(words, 0, ids, out=dst)))

        th = threading.Thread(target=worker_with_threads)
        th.start()
        th.join()
        out[f"gather_worker_setthreads_{count}_gbps"] = res[0]
        out[f"dma_{count}_gbps"] = _rate(count * bb, lambda: dev[: count * bb].copy_(
            staging.tensor[: count * bb], non_blocking=True), reps=200)
    from pulseio._cuda.launch import BlockArray, CopyBlocksLauncher

    src = BlockArray(host.device_ptr, host.num_blocks, bb)
    dst_pool = BlockArray(device.device_ptr, device.num_slots, bb)
    stream = torch.cuda.Stream()
    for ctas in (64, 132, 264, 528):  # the copy kernel alone, back to back: GPU-bound rate per CTA budget
        launcher = CopyBlocksLauncher(max_ctas=ctas)
        for count in (64, 512, 4096):
            src_ids = torch.from_numpy(rng.choice(host.num_blocks, count, replace=False)).cuda()
            dst_ids = torch.randperm(device.num_slots, device="cuda")[:count]
            reps = 50
            for _ in range(3):
                launcher(stream.cuda_stream, src, src_ids.data_ptr(), dst_pool, dst_ids.data_ptr(), count)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(reps):
                launcher(stream.cuda_stream, src, src_ids.data_ptr(), dst_pool, dst_ids.data_ptr(), count)
            end.record(stream)
            end.synchronize()
            out[f"kernel_ctas{ctas}_{count}_gbps"] = count * bb * reps / (start.elapsed_time(end) / 1e3) / 1e9
    with pulseio.DmaEngine(host, device, DmaConfig(merge_blocks=64)) as engine:
        launch = engine._routes._copy_blocks
        routes = engine._routes
        ids64 = torch.arange(64, dtype=torch.int64, device="cuda")
        t0 = time.perf_counter()
        for _ in range(1000):
            launch(routes.stream.cuda_stream, routes._pool_array, ids64.data_ptr(), routes._pool_array,
                   ids64.data_ptr(), 64)
        out["launch_host_us"] = (time.perf_counter() - t0) * 1e3
        routes.stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(1000):
            torch.cuda.Event().record(routes.stream)
        out["event_create_record_us"] = (time.perf_counter() - t0) * 1e3
        ids_np = [rng.choice(host.num_blocks, 512, replace=False) for _ in range(8)]
        slots_np = [rng.permutation(device.num_slots)[:512] for _ in range(8)]
        t0 = time.perf_counter()
        for i in range(1000):
            pulseio.plan.make_plan(pulseio.Direction.H2D, ids_np[i % 8], slots_np[i % 8], num_host_blocks=host.num_blocks,
                                   num_device_slots=device.num_slots, block_bytes=bb)
        out["make_plan_512_us"] = (time.perf_counter() - t0) * 1e3
    from pulseio.bench.timing import median_latency_us, sustained_seconds

    for ctas in (64, 132):
        for count in (64, 512, 4096):
            with pulseio.DmaEngine(host, device, DmaConfig(merge_blocks=count, zero_copy_ctas=ctas)) as engine:
                idl = [rng.choice(host.num_blocks, count, replace=False) for _ in range(8)]
                sl = [rng.permutation(device.num_slots)[:count] for _ in range(8)]

                def submit(i: int, engine=engine, idl=idl, sl=sl) -> pulseio.Transfer:
                    return engine.recall(idl[i % 8], sl[i % 8], strategy=Strategy.ZERO_COPY, stream_ordered=False)

                for i in range(20):
                    submit(i).wait()
                for window in (8, 32):
                    sec = sustained_seconds(submit, max(100, min(2000, (256 << 20) // (count * bb))), window)
                    out[f"zc_ctas{ctas}_{count}_w{window}_gbps"] = count * bb / sec / 1e9
                out[f"zc_ctas{ctas}_{count}_lat_us"] = median_latency_us(submit, 50)
    for count in (64, 4096):  # where the host time of a gather_dma recall goes, stage by stage
        with pulseio.DmaEngine(host, device, DmaConfig(merge_blocks=count)) as engine:
            idl = [rng.choice(host.num_blocks, count, replace=False) for _ in range(8)]
            sl = [rng.permutation(device.num_slots)[:count] for _ in range(8)]
            for i in range(5):
                engine.recall(idl[i % 8], sl[i % 8], strategy=Strategy.GATHER_DMA, stream_ordered=False).wait()
            engine._routes.stage_seconds.clear()
            from pulseio.bench.timing import sustained_seconds
            reps = 100
            sec = sustained_seconds(lambda i: engine.recall(idl[i % 8], sl[i % 8], strategy=Strategy.GATHER_DMA,
                                                            stream_ordered=False), reps, 8)
            out[f"gd_{count}_per_transfer_us"] = sec * 1e6
            for stage, total in engine._routes.stage_seconds.items():
                if stage != "pieces":
                    out[f"gd_{count}_{stage}_us"] = total / reps * 1e6
    for key, value in out.items():
        print(f"{key:>40}: {value:10.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    staging.close()
    host.close()


if __name__ == "__main__":
    main()
