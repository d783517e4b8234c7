"""Decode benchmark against the memory roofline measured in the same process.

A decode step must read every weight once and every cached K/V of the batch once, so its floor
is `bytes_read / copy_bandwidth`, where the bandwidth is that of a large device-to-device `copy_`
(bytes read + written over time). Weight bytes count the embedding as the B rows gathered and
every other matrix in full; KV bytes count exactly the tokens attended (not whole blocks).

Workload: random-weight presets (N(0, 0.02^2), created on the device), KV written in place as
N(0, 1) values (`RandomKV`), random prompt tokens; the timed loop feeds each step's greedy tokens
back on the device (no host sync), one CUDA graph replay per step.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import Enum

import torch
from tqdm import tqdm

from .config import CacheConfig, DType, SchedulerConfig
from .engine import TORCH_DTYPES, Engine
from .errors import PromptTooLongError
from .kv.block_table import blocks_for
from .kv.handoff import RandomKV
from .model.checkpoint import ModelSource, open_model
from .preflight import check_fits, estimate, fixes_for
from .request import SamplingParams
from .step_bytes import StepShape, step_bytes

_CPU_WORKLOAD_END = "one eager decode step per step on the CPU (no CUDA graphs)."
PROFILED_STEPS = 3   # steps after the timed ones, under the profiler that counts kernels (1 warm-up + 2 counted)


def decode_len(context_len: int, warmup: int, steps: int) -> int:
    """Positions a benchmark's request reaches: its prompt, the first step, the warm-up, timed and profiled steps."""
    return context_len + warmup + steps + PROFILED_STEPS + 3


class BenchMode(Enum):
    VANILLA = "vanilla"     # all KV on the GPU, full attention


@dataclass(frozen=True)
class BenchResult:
    model: str
    mode: str
    device: str
    dtype: str
    batch_size: int
    context_len: int
    steps: int
    cuda_graphs: bool
    step_ms: float              # sustained: first step start to last step end, over steps
    step_ms_median: float       # median of per-step times
    tokens_per_s: float
    weight_bytes: int           # read per step
    kv_bytes: int               # read per step (mean context over the timed steps)
    bytes_per_step: int
    copy_bandwidth_gbps: float  # GB/s, read + written, device-to-device copy in this process
    roofline_ms: float
    roofline_ratio: float       # step_ms / roofline_ms (1.0 = at the roofline)
    finite_logits: bool
    kernels_per_step: float | None   # kernels on the GPU's own timeline per step (profiler; None on a CPU)
    compiled: bool              # decode halves ran through torch.compile
    compile_error: str | None   # why not, if torch.compile was asked for and failed
    torch_version: str
    workload: str = __doc__.split("Workload: ")[1].strip().replace("\n", " ")
    skinny_gemm: bool = False   # projections of <= 32 rows ran through skinny_linear (`EngineConfig.skinny_gemm`)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        kernels = "" if self.kernels_per_step is None else f", {self.kernels_per_step:,.0f} kernels/step"
        return (f"{self.model} {self.mode} B={self.batch_size} ctx={self.context_len}: "
                f"{self.step_ms:.3f} ms/step ({self.tokens_per_s:,.0f} tok/s), "
                f"{self.bytes_per_step / 1e9:.2f} GB/step, roofline {self.roofline_ms:.3f} ms at "
                f"{self.copy_bandwidth_gbps:,.0f} GB/s -> {self.roofline_ratio:.3f}x{kernels}")


def measure_copy_bandwidth_sync(device: torch.device, nbytes: int = 2 << 30, iters: int = 10) -> float:
    """Bytes per second (read + written) of a `nbytes` device-to-device copy, best of `iters`."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(iters):
        timer = _Timer(device)
        dst.copy_(src)
        times.append(timer.stop())
    seconds = [t() for t in times]
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return 2 * nbytes / min(seconds)


def measure_upload_bandwidth(host: torch.Tensor, device: torch.device, nbytes: int = 512 << 20, reps: int = 5
                             ) -> float:
    """Bytes per second of a contiguous copy of (up to) `nbytes` of pinned `host` memory to `device`, best of
    `reps`: the link's peak as the recalls see it."""
    src = host.view(-1).view(torch.uint8)[:nbytes]
    dst = torch.empty(src.numel(), dtype=torch.uint8, device=device)
    best = float("inf")
    for _ in range(reps):
        timer = _Timer(device)
        dst.copy_(src, non_blocking=True)
        best = min(best, timer.stop()())
    return src.numel() / best


def run_bench(model: str | ModelSource, *, mode: BenchMode = BenchMode.VANILLA, batch_size: int,
              context_len: int, steps: int, warmup: int = 5, device: str | None = None, use_cuda_graphs: bool = True,
              compile_decode: bool | None = None, progress: bool = True, seed: int = 0,
              skinny_gemm: bool = True) -> BenchResult:
    """Checks the run against the model's context and the device's memory before building anything.
    `skinny_gemm`: `EngineConfig.skinny_gemm` (False: every projection through cuBLAS)."""
    source = model if isinstance(model, ModelSource) else open_model(model)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    max_len = decode_len(context_len, warmup, steps)
    num_blocks = 1 + batch_size * blocks_for(max_len, CacheConfig().block_size)
    copy_bytes = (2 << 30) if dev.type == "cuda" else (256 << 20)
    _preflight(source, device, batch_size, context_len, max_len, num_blocks)
    bench_status(progress, f"measuring {device} copy bandwidth ({copy_bytes >> 20} MiB copies)")
    bandwidth = measure_copy_bandwidth_sync(dev, copy_bytes)
    bench_status(progress, f"building {source.spec} and its KV cache ({batch_size} x {max_len} tokens)")
    engine = Engine.from_model(
        source, device=device, seed=seed, use_cuda_graphs=use_cuda_graphs, compile_decode=compile_decode,
        max_model_len=max_len, cache=CacheConfig(num_blocks=num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=batch_size), progress=progress, skinny_gemm=skinny_gemm,
    )
    gen = torch.Generator().manual_seed(seed)
    for i in range(batch_size):
        prompt = torch.randint(0, engine.config.model.vocab_size, (context_len + 1,), generator=gen).tolist()
        engine.add_request(prompt, SamplingParams(max_new_tokens=max_len - context_len - 1, ignore_eos=True),
                           kv=RandomKV(context_len, seed=seed + i))
    bench_status(progress, "writing the KV and running the first decode step (captures the CUDA graph on a GPU)")
    engine.step()   # admits all, writes their KV, captures the graph, runs the first decode step
    graphs = engine.runner.graphs
    bucket = graphs.bucket_for(batch_size)
    bar = tqdm(total=warmup + steps, disable=not progress, desc=f"decode B={batch_size} ctx={context_len}",
               unit="step", leave=False)
    for _ in range(warmup):
        graphs.advance_nowait(bucket)
        graphs.run_nowait(bucket)
        bar.update()
    timers = []
    for i in range(steps):
        bar.update()
        graphs.advance_nowait(bucket)
        timers.append(_Timer(dev))
        graphs.run_nowait(bucket)
        timers[-1].stop()
        if i % 10 == 9:
            timers[-1].wait()   # keep the bar honest: the host runs at most 10 steps ahead
    bar.close()
    per_step = sorted(t() for t in timers)
    sustained = timers[0].seconds_until(timers[-1]) / steps
    finite = bool(torch.isfinite(graphs.logits[:batch_size]).all())
    mean_ctx = context_len + 2 + warmup + (steps - 1) / 2

    def step() -> None:
        graphs.advance_nowait(bucket)
        graphs.run_nowait(bucket)

    kernels = count_kernels_per_step(step, dev, PROFILED_STEPS - 1)
    return _result(engine, source.spec, mode, device, batch_size, context_len, steps, use_cuda_graphs, sustained,
                   per_step[len(per_step) // 2], mean_ctx, bandwidth, finite, kernels)


def count_kernels_per_step(step: Callable[[], object], device: torch.device, steps: int = 2) -> float | None:
    """Kernels the GPU ran per call of `step`, from its own timeline (torch.profiler's CUDA activity: each
    kernel of a replayed CUDA graph is one record), memcpys and memsets left out; None on a CPU."""
    if device.type != "cuda":
        return None
    step()
    torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset", "[memory]"))]
    return len(kernels) / steps


def _preflight(source: ModelSource, device: str, batch: int, context_len: int, max_len: int,
               num_blocks: int) -> None:
    """The context and the memory of the run (the copy-bandwidth buffers are freed before the model is built)."""
    limit = source.config.max_position_embeddings
    if max_len > limit:
        raise PromptTooLongError(
            f"--context-len {context_len} + the decoded positions (first, warm-up, timed, profiled) = {max_len} "
            f"positions exceed {source.spec}'s context of {limit}; pass --context-len "
            f"{limit - (max_len - context_len)} or less"
        )
    dtype = DType.BFLOAT16 if device.startswith("cuda") else DType.FLOAT32
    need = estimate(source.config, dtype_bytes=TORCH_DTYPES[dtype].itemsize,
                    kv_tokens=num_blocks * CacheConfig().block_size, batch=batch,
                    prefill_tokens=SchedulerConfig().max_prefill_tokens)
    check_fits(need, device=device, what=f"{source.spec} batch {batch} x {max_len} tokens",
               fixes=fixes_for(source.spec, device, "fewer --batch-size or --context-len"))


def bench_status(progress: bool, text: str) -> None:
    """A progress line of `pulseio-engine bench` on stderr (both its decode benchmarks)."""
    if progress:
        tqdm.write(f"pulseio-engine bench: {text}", file=sys.stderr)


def _result(engine: Engine, model: str, mode: BenchMode, device: str, batch: int, ctx: int, steps: int,
            graphs: bool, step_s: float, median_s: float, mean_ctx: float, bandwidth: float,
            finite: bool, kernels: float | None) -> BenchResult:
    read = step_bytes(StepShape.of(engine), [mean_ctx] * batch)
    weight_bytes, kv_bytes, total = read.weights, read.dense_kv, read.total
    roofline_s = total / bandwidth
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"
    workload = BenchResult.workload
    if not device.startswith("cuda"):
        workload = workload.split("one CUDA graph replay")[0] + _CPU_WORKLOAD_END
    return BenchResult(model, mode.value, name, str(engine.kv.dtype).removeprefix("torch."), batch, ctx, steps,
                       graphs and device.startswith("cuda"), step_s * 1e3, median_s * 1e3, batch / step_s,
                       weight_bytes, kv_bytes, total, bandwidth / 1e9, roofline_s * 1e3, step_s / roofline_s,
                       finite, kernels, engine.model.compiled, engine.model.compile_error, torch.__version__, workload,
                       skinny_gemm=engine.model.workspace is not None)


class _Timer:
    """Times stream work with CUDA events on GPU, wall clock on CPU. Call the instance for seconds."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        if self._cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = self._t1 = time.perf_counter()

    def stop(self) -> _Timer:
        if self._cuda:
            self._end.record()
        else:
            self._t1 = time.perf_counter()
        return self

    def wait(self) -> None:
        if self._cuda:
            self._end.synchronize()

    def seconds_until(self, later: _Timer) -> float:
        """From this timer's start to `later`'s end."""
        if self._cuda:
            later._end.synchronize()
            return self._start.elapsed_time(later._end) / 1e3
        return later._t1 - self._t0

    def __call__(self) -> float:
        return self.seconds_until(self)
