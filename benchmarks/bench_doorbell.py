"""Doorbell runtime on a GPU: publish->seen and publish->landed latency, doorbell vs direct bandwidth,
and the time the submitting thread is blocked per step, doorbell path vs the sync path.

    PYTHONPATH=. python benchmarks/bench_doorbell.py --out results.json [--quick] [--strategies resident,auto]
        [--recall 104x65536]   # the latency section's request: blocks x bytes (default 64 x 8 KiB)
        [--ctas 52]            # the copy kernels' CTA budget (DmaConfig.zero_copy_ctas; default 64)
        [--busy-gpu-gib 4]     # the resident route's latency again, the GPU busy copying device memory meanwhile

How each figure is taken:
* publish->seen: the publish kernel stamps %globaltimer into the slot; the poller stamps
  perf_counter_ns when it reads it. The two clocks are aligned by a ping-pong (NTP-style): a kernel
  spins on a pinned flag the host sets at h0, stamps g, acks; the host sees the ack at h1; offset =
  g - (h0 + h1) / 2 over the rounds of smallest round trip (error <= half that round trip, printed).
* publish->landed: both ends on the GPU clock. Each step enqueues a ~0.5 ms GPU sleep, then the
  publish, the consumer stream's wait on the completion word, and a kernel stamping %globaltimer, so
  everything is enqueued before the publish runs; landed - published is what a consumer sees. With
  --recall 104x65536 each request is a 32K layer's recall in the engine (qwen3-14b, budget 2048), alone
  on an idle GPU; the resident route also reports its rate from the copier's start and from the publish, and
  publish -> landed early for the requests every copy CTA copied from the ids mirror before their task came
  (the copier's stamp: when a captured device wait, a RecallGraph's, would have ended; this bench's wait, on
  the completion word, ends when the task lands). With --busy-gpu-gib G the resident route's latency is taken
  again while a second stream copies G GiB of device memory each step (a kernel on every SM streaming HBM, as a
  decode step's weight products do; 4 GiB copy for longer than a step, so the copies run back to back through
  every publish): what the model's kernels beside the copier do to a recall's flight.
* bandwidth: bytes / wall time of `steps` back-to-back recalls of 2048 x 8 KiB (ids on the GPU via
  the ring, vs ids already on the host straight to the I/O worker), same runtime, same strategy (blocks of
  the --recall size).
* blocked: per decode-like step (a GEMM as the "layer", scores, top-k, recall, consume), the time the
  submitting thread spends inside the recall calls: post_recall + device_wait (doorbell) vs
  ids.cpu() + recall + device_wait (sync path).
* busy host (--busy-host-us N, the resident route): two requests a step, published 0.3 and 0.5 ms after the
  step is enqueued, while the submitting thread runs N us of pure Python (holding the GIL, as a serving loop's
  bookkeeping does); publish->landed of each, at the interpreter's switch interval of 5 ms and of 100 us
  (`pulseio.gil_switch_interval`). The poller's fast lane takes the first request without the GIL; it takes
  the GIL back before it looks for the second, which waits for it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pulseio  # noqa: E402
from pulseio import DmaConfig, RuntimeConfig, Strategy  # noqa: E402
from pulseio.bench.records import git_sha  # noqa: E402

BLOCK = 8 << 10
STRATEGIES = [Strategy.RESIDENT, Strategy.ZERO_COPY, Strategy.GATHER_DMA, Strategy.BATCHED, Strategy.AUTO]
BLOCKED_STRATEGIES = (Strategy.RESIDENT, Strategy.AUTO)
BUSY_SWITCH_S = (5e-3, 1e-4)  # the interpreter's default GIL switch interval, and the serving loop's


def pct(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean()), "min": float(a.min()), "max": float(a.max())}


def gpu_kernels():
    """numba kernels of the bench: the clock ping-pong and the landed stamp."""
    from numba import cuda

    from pulseio._cuda import _numba_compat  # noqa: F401
    from pulseio._cuda.sysmem import globaltimer, load_acquire_sys, store_release_sys

    @cuda.jit
    def probe(flag_addr, ack_addr, out, rounds, timeout_ns):
        if cuda.threadIdx.x != 0:
            return
        for k in range(rounds):
            start = globaltimer()
            while load_acquire_sys(flag_addr) < k + 1:
                if globaltimer() - start > timeout_ns:
                    out[k] = -1
                    return
            out[k] = globaltimer()
            cuda.threadfence_system()
            store_release_sys(ack_addr, k + 1)

    @cuda.jit("void(int64[::1], int64)")
    def stamp(out, i):
        out[i] = globaltimer()

    return cuda, probe, stamp


class _Cai:
    """A pinned host int64 buffer shown to numba as device memory (UVA address)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.__cuda_array_interface__ = {"shape": (tensor.numel(),), "typestr": "<i8",
                                         "data": (tensor.data_ptr(), False), "version": 3, "strides": None}


def calibrate_clock(rounds: int = 200) -> dict:
    cuda, probe, _ = gpu_kernels()
    bufs = torch.zeros(3, rounds + 8, dtype=torch.int64).pin_memory()
    flag, ack, out = bufs[0], bufs[1], bufs[2]
    probe[1, 32](flag.data_ptr(), ack.data_ptr(), _Cai(out), rounds, 2_000_000_000)
    flag_np, ack_np = flag.numpy(), ack.numpy()
    h0s, h1s = [], []
    for k in range(rounds):
        time.sleep(20e-6)
        h0 = time.perf_counter_ns()
        flag_np[0] = k + 1
        deadline = h0 + 2_000_000_000
        while ack_np[0] < k + 1:
            if time.perf_counter_ns() > deadline:
                raise RuntimeError(f"clock probe: no ack for round {k}")
        h1s.append(time.perf_counter_ns())
        h0s.append(h0)
    cuda.synchronize()
    g = out.numpy()[:rounds].astype(np.float64)
    h0, h1 = np.asarray(h0s, dtype=np.float64), np.asarray(h1s, dtype=np.float64)
    rtt = h1 - h0
    best = np.argsort(rtt)[: max(5, rounds // 5)]
    offsets = g[best] - (h0[best] + h1[best]) / 2
    return {"offset_ns": float(np.median(offsets)), "rtt_min_us": float(rtt.min() / 1e3),
            "rtt_p50_us": float(np.median(rtt) / 1e3), "offset_spread_us": float(np.ptp(offsets) / 1e3)}


def open_rt(strategy: Strategy = Strategy.AUTO, block_bytes: int = BLOCK, ctas: int = DmaConfig.zero_copy_ctas,
            host_blocks: int = 16384) -> pulseio.Runtime:
    # resident_idle_us: the resident kernel stays up across the ~0.5 ms steps of `latency`, as it would
    # across the layers of a decode step; with the 200 us default each request would relaunch it
    cfg = RuntimeConfig(device="cuda", host_blocks=host_blocks, device_slots=4096, block_bytes=block_bytes,
                        ring_slots=128, max_blocks_per_request=2048, strategy=strategy, spin_iterations=5_000_000,
                        poll_sleep_s=(10e-6, 200e-6),
                        dma=DmaConfig(resident_idle_us=2000, zero_copy_ctas=ctas))
    rt = pulseio.open_runtime(cfg)
    rt.host_pool.blocks.copy_(torch.randint(0, 256, rt.host_pool.blocks.shape, dtype=torch.uint8))
    return rt


def latency(rt: pulseio.Runtime, offset_ns: float, iters: int, k: int = 64, busy_gib: float = 0.0) -> dict:
    _, _, stamp = gpu_kernels()
    from numba import cuda

    side, src, dst = None, None, None
    if busy_gib > 0:          # a device copy each step on its own stream, running through the step's publish
        side = torch.cuda.Stream()
        src = torch.empty(int(busy_gib * 2**30) // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
    stream = torch.cuda.Stream()
    nstream = cuda.external_stream(stream.cuda_stream)
    stamps = torch.zeros(iters, dtype=torch.int64, device="cuda")
    ids_all = torch.stack([torch.randperm(rt.host_pool.num_blocks, device="cuda")[:k] for _ in range(iters)])
    slots = torch.arange(k, device="cuda")
    torch.cuda.synchronize()
    posted = []
    for i in range(-5, iters):
        if side is not None:
            with torch.cuda.stream(side):
                dst.copy_(src)                                                  # type: ignore[union-attr]
        with torch.cuda.stream(stream):
            torch.cuda._sleep(1_000_000)  # ~0.5 ms: all of the step is enqueued before the publish runs
        done = rt.post_recall(host_ids=ids_all[max(i, 0)], device_slots=slots, stream=stream, tag=i)
        done.device_wait(stream)
        if i >= 0:
            stamp[1, 1, nstream](stamps, i)
        done.wait(timeout=10)
        stream.synchronize()
        if i >= 0:
            posted.append(done)
    torch.cuda.synchronize()
    landed = stamps.cpu().numpy()
    stages = {}
    if all(d.landed_ns is not None for d in posted):  # resident tasks: when each landed, on the GPU clock
        stages = {
            "seen_to_submit_host_us": pct([(d.transfer.submitted_ns - d.seen_ns) / 1e3 for d in posted]),
            "publish_to_task_taken_us": pct([(d.taken_ns - d.published_ns) / 1e3 for d in posted]),
            "publish_to_task_landed_us": pct([(d.landed_ns - d.published_ns) / 1e3 for d in posted]),
            "publish_to_early_landed_us": pct([(d.early_landed_ns - d.published_ns) / 1e3 for d in posted
                                               if d.early_landed_ns is not None]),
            "task_landed_to_consumer_us": pct([(landed[i] - d.landed_ns) / 1e3 for i, d in enumerate(posted)]),
            "copy_gbps": pct([d.nbytes / (d.landed_ns - d.taken_ns) for d in posted]),
            "publish_to_task_landed_gbps": pct([d.nbytes / (d.landed_ns - d.published_ns) for d in posted]),
        }
    return {
        **stages,
        "publish_to_seen_us": pct([(d.seen_ns - (d.published_ns - offset_ns)) / 1e3 for d in posted]),
        "publish_to_landed_us": pct([(landed[i] - d.published_ns) / 1e3 for i, d in enumerate(posted)]),
        "post_to_seen_host_us": pct([(d.seen_ns - d.submitted_ns) / 1e3 for d in posted]),
        "post_to_landed_host_us": pct([(d.finished_ns - d.submitted_ns) / 1e3 for d in posted]),
    }


def bandwidth(rt: pulseio.Runtime, strategy: Strategy, steps: int, k: int = 2048) -> dict:
    ids_dev = torch.stack([torch.randperm(rt.host_pool.num_blocks, device="cuda")[:k] for _ in range(steps)])
    ids_host = ids_dev.cpu().numpy()
    slots_dev = torch.arange(k, device="cuda")
    slots_host = slots_dev.cpu().numpy()
    out = {}
    for path in ("direct", "doorbell", "direct", "doorbell"):  # interleaved, second round reported
        torch.cuda.synchronize()
        start = time.perf_counter()
        if path == "doorbell":
            done = [rt.post_recall(host_ids=ids_dev[i], device_slots=slots_dev, strategy=strategy, tag=i)
                    for i in range(steps)]
        else:
            done = [rt.recall(host_ids=ids_host[i], device_slots=slots_host, strategy=strategy, stream_ordered=False)
                    for i in range(steps)]
        for d in done:
            d.wait(timeout=60)
        seconds = time.perf_counter() - start
        out[path] = {"gbps": steps * k * rt.host_pool.block_bytes / seconds / 1e9, "seconds": seconds}
    out["doorbell_over_direct"] = out["doorbell"]["gbps"] / out["direct"]["gbps"]
    return out


def blocked(rt: pulseio.Runtime, steps: int, k: int) -> dict:
    stream = torch.cuda.Stream()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    digests = torch.randn(rt.host_pool.num_blocks, 128, device="cuda")
    slots_dev = torch.arange(k, device="cuda")
    slots_host = slots_dev.cpu().numpy()
    out = {}
    for path in ("sync", "doorbell", "sync", "doorbell"):
        torch.cuda.synchronize()
        inside, done = [], []
        start = time.perf_counter()
        for i in range(steps):
            with torch.cuda.stream(stream):
                h = a @ a  # the "layer" the GPU is busy with when the selection is made
                scores = digests @ h[0, :128].float()
                ids = torch.topk(scores, k).indices  # [k] int64, cuda
                t0 = time.perf_counter()
                if path == "doorbell":
                    d = rt.post_recall(host_ids=ids, device_slots=slots_dev, stream=stream, tag=i)
                else:
                    # .cpu() waits for the GEMM and top-k
                    d = rt.recall(host_ids=ids.cpu().numpy(), device_slots=slots_host)
                d.device_wait(stream)
                inside.append((time.perf_counter() - t0) * 1e6)
                rt.device_pool.slots.index_select(0, slots_dev).sum()  # consume
                done.append(d)
        enqueue_s = time.perf_counter() - start
        stream.synchronize()
        for d in done:
            d.wait(timeout=60)
        total_s = time.perf_counter() - start
        out[path] = {"blocked_us": pct(inside), "enqueue_ms_per_step": enqueue_s / steps * 1e3,
                     "wall_ms_per_step": total_s / steps * 1e3}
    return out


def busy_host(rt: pulseio.Runtime, steps: int, k: int, busy_us: float, switch_s: float) -> dict:
    _, _, stamp = gpu_kernels()
    from numba import cuda

    stream = torch.cuda.Stream()
    nstream = cuda.external_stream(stream.cuda_stream)
    stamps = torch.zeros(2 * steps, dtype=torch.int64, device="cuda")
    ids_all = torch.stack([torch.randperm(rt.host_pool.num_blocks, device="cuda")[:k] for _ in range(2 * steps)])
    slots = torch.arange(2 * k, device="cuda").view(2, k)
    torch.cuda.synchronize()
    posted: list[list] = [[], []]
    with pulseio.gil_switch_interval(switch_s):
        for i in range(-3, steps):
            step = []
            for j, sleep in enumerate((600_000, 400_000)):          # ~0.3 ms, then ~0.2 ms more
                with torch.cuda.stream(stream):
                    torch.cuda._sleep(sleep)
                done = rt.post_recall(host_ids=ids_all[2 * max(i, 0) + j], device_slots=slots[j], stream=stream,
                                      tag=2 * i + j)
                done.device_wait(stream)
                if i >= 0:
                    stamp[1, 1, nstream](stamps, 2 * i + j)
                step.append(done)
            until = time.perf_counter() + busy_us * 1e-6
            spins = 0
            while time.perf_counter() < until:                      # pure Python: the GIL held throughout
                spins += 1
            for j, done in enumerate(step):
                done.wait(timeout=10)
                if i >= 0:
                    posted[j].append(done)
            stream.synchronize()
    landed = stamps.cpu().numpy()
    return {f"request_{j}_publish_to_landed_us": pct([(landed[2 * i + j] - d.published_ns) / 1e3
                                                      for i, d in enumerate(posted[j])]) for j in (0, 1)}


def section(results: dict, name: str, fn, *args) -> None:
    print(f"--- {name}", flush=True)
    t = time.perf_counter()
    try:
        results[name] = fn(*args)
        print(json.dumps(results[name], indent=1)[:3000], flush=True)
    except Exception:
        results[name] = {"error": traceback.format_exc()}
        print(results[name]["error"], flush=True)
    print(f"    ({time.perf_counter() - t:.1f} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench_doorbell.json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--strategies", type=lambda text: [Strategy(s) for s in text.split(",")], default=STRATEGIES,
                        help="routes to measure, comma-separated (default: all of them)")
    parser.add_argument("--recall", type=_shape, default=(64, BLOCK), metavar="BLOCKSxBYTES",
                        help="the latency section's request, blocks x bytes per block (default 64x8192)")
    parser.add_argument("--ctas", type=int, default=DmaConfig.zero_copy_ctas,
                        help="CTA budget of the copy kernels, DmaConfig.zero_copy_ctas (default %(default)s)")
    parser.add_argument("--busy-gpu-gib", type=float, default=0.0, metavar="GIB",
                        help="also time the resident route's latency while another stream copies this many GiB of "
                             "device memory each step (default: skip)")
    parser.add_argument("--busy-host-us", type=float, default=0.0, metavar="US",
                        help="also time two requests a step while the submitting thread runs this long in pure "
                             "Python, at GIL switch intervals of 5 ms and 100 us (resident route; default: skip)")
    args = parser.parse_args()
    n_lat, n_bw, n_blk = (60, 10, 20) if args.quick else (400, 40, 100)
    sha = git_sha()
    results: dict = {"meta": {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now().isoformat(),
                              "git_sha": sha, "torch": torch.__version__, "python": platform.python_version(),
                              "recall_blocks": args.recall[0], "block_bytes": args.recall[1], "quick": args.quick,
                              "strategies": [s.value for s in args.strategies], "ctas": args.ctas,
                              "busy_host_us": args.busy_host_us, "busy_gpu_gib": args.busy_gpu_gib}}
    section(results, "clock", calibrate_clock)
    for strategy in args.strategies:
        rt = open_rt(strategy, args.recall[1], args.ctas)
        try:
            results["meta"]["stream_mem_ops"] = bool(rt._publisher.waits_on_device)
            # the two clocks drift apart by microseconds per second: align them right before each section
            section(results, f"clock_{strategy.value}", calibrate_clock)
            offset = results[f"clock_{strategy.value}"].get("offset_ns", float("nan"))
            section(results, f"latency_{strategy.value}", latency, rt, offset, n_lat, args.recall[0])
            if args.busy_gpu_gib > 0 and strategy is Strategy.RESIDENT:
                section(results, "latency_busy_gpu_resident", latency, rt, offset, n_lat, args.recall[0],
                        args.busy_gpu_gib)
            section(results, f"bandwidth_2048_{strategy.value}", bandwidth, rt, strategy, n_bw)
            if strategy in BLOCKED_STRATEGIES:
                for k in (64, 1024):
                    section(results, f"blocked_per_step_k{k}_{strategy.value}", blocked, rt, n_blk, k)
            if args.busy_host_us > 0 and strategy is Strategy.RESIDENT:
                for switch_s in BUSY_SWITCH_S:
                    section(results, f"busy_host_{switch_s * 1e6:.0f}us", busy_host, rt, n_blk, args.recall[0],
                            args.busy_host_us, switch_s)
            results[f"runtime_stats_{strategy.value}"] = repr(rt.statistics())
        finally:
            rt.close()
    Path(args.out).write_text(json.dumps(results, indent=1))
    print_summary(results)


def _shape(text: str) -> tuple[int, int]:
    """'104x65536' -> (104, 65536): blocks and bytes per block."""
    try:
        blocks, nbytes = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BLOCKSxBYTES such as 104x65536, got {text!r}") from None
    if not 0 < blocks <= 2048 or nbytes <= 0 or nbytes % 4096:
        raise argparse.ArgumentTypeError(f"blocks must be 1..2048 and bytes a positive multiple of 4096, got {text!r}")
    return blocks, nbytes


def _stages(lat: dict) -> str:
    """A resident latency section's device-clock stages, one line."""
    nan = float("nan")
    taken, copy, whole = lat["publish_to_task_taken_us"], lat["copy_gbps"], lat["publish_to_task_landed_gbps"]
    early = lat.get("publish_to_early_landed_us", {})
    return (f"publish->copier's start p50 {taken['p50']:6.1f} us, then {copy['p50']:5.1f} GB/s p50; publish->landed "
            f"{whole['p50']:5.1f} GB/s p50; landed early {early.get('n', 0)} of {taken['n']}, publish->landed early "
            f"p50 {early.get('p50', nan):6.1f} us")


def print_summary(r: dict) -> None:
    nan = float("nan")
    meta, c = r["meta"], r.get("clock", {})
    shape = f"{meta['recall_blocks']}x{meta['block_bytes'] >> 10}K"
    measured = [s for s in STRATEGIES if s.value in meta["strategies"]]
    print("\n=== summary (bench_doorbell) ===")
    print(f"device {meta['device']}  sha {meta['git_sha'][:10]}  stream mem ops {meta.get('stream_mem_ops')}")
    print(f"clock offset error <= {c.get('rtt_min_us', nan) / 2:.2f} us (min round trip {c.get('rtt_min_us')} us)")
    for s in measured:
        lat = r.get(f"latency_{s.value}", {})
        bw = r.get(f"bandwidth_2048_{s.value}", {})
        seen, land = lat.get("publish_to_seen_us", {}), lat.get("publish_to_landed_us", {})
        door, direct = bw.get("doorbell", {}).get("gbps", nan), bw.get("direct", {}).get("gbps", nan)
        print(f"{s.value:>10}: publish->seen p50 {seen.get('p50', nan):7.1f} p99 {seen.get('p99', nan):7.1f} us"
              f" | publish->landed({shape}) p50 {land.get('p50', nan):7.1f} p99 {land.get('p99', nan):7.1f} us"
              f" | 2048x{meta['block_bytes'] >> 10}K doorbell {door:5.1f} GB/s direct {direct:5.1f} GB/s"
              f" ratio {bw.get('doorbell_over_direct', nan):.3f}"
              + ("  ERROR" if "error" in lat or "error" in bw else ""))
        if "copy_gbps" in lat:
            print(f"{'':>10}  {_stages(lat)}")
        busy = r.get("latency_busy_gpu_resident") if s is Strategy.RESIDENT else None
        if busy is not None:
            print(f"{'':>10}  busy GPU ({meta['busy_gpu_gib']:g} GiB copied a step): " +
                  (_stages(busy) if "copy_gbps" in busy else "ERROR"))
    for switch_s in BUSY_SWITCH_S:
        b = r.get(f"busy_host_{switch_s * 1e6:.0f}us")
        if b is None:
            continue
        if "error" in b:
            print(f"busy host, switch interval {switch_s * 1e6:.0f} us: ERROR")
            continue
        first, second = b["request_0_publish_to_landed_us"], b["request_1_publish_to_landed_us"]
        print(f"busy host {meta['busy_host_us']:.0f} us, switch interval {switch_s * 1e6:5.0f} us: publish->landed "
              f"p50 / p99, first request {first['p50']:7.1f} / {first['p99']:7.1f} us, second {second['p50']:7.1f} / "
              f"{second['p99']:7.1f} us")
    for s in (s for s in BLOCKED_STRATEGIES if s in measured):
        for k in (64, 1024):
            b = r.get(f"blocked_per_step_k{k}_{s.value}", {})
            if "error" in b or not b:
                print(f"blocked k={k} {s.value}: ERROR/missing")
                continue
            for path in ("doorbell", "sync"):
                x = b[path]
                us = x["blocked_us"]
                print(f"blocked {s.value:>8} k={k:4d} {path:>8}: p50 {us['p50']:8.1f} us p99 {us['p99']:8.1f} us;"
                      f" enqueue {x['enqueue_ms_per_step']:.3f} ms/step, wall {x['wall_ms_per_step']:.3f} ms/step")


if __name__ == "__main__":
    main()
