"""Probe: which first-time operations on a consumer stream wait for a kernel that spins on another stream?

A kernel (pulseio's wait kernel) spins on stream A until a pinned host word reaches 1. On the consumer
stream the probe runs one operation X, then a stream write of 5 to the word. A helper thread sets the word
to 1 after HOLD_S, whatever happened. Per case (each in a fresh process):

- launch_s: how long X held the host;
- landed_s: when the consumer's write of 5 was seen, from X's start. Near zero: X did not wait for the
  spinner. Near HOLD_S with a short launch_s: X waited on the GPU for the spinner to end (its stream
  stops behind it, the host does not); with launch_s near HOLD_S: X waited on the host.

With `--cross`, the word is instead set by a kernel that another thread launches CROSS_AT_S after X
started (as pulseio's poller launches the copier): `helper_launch_s` says whether that launch waited
while the main thread was held in X, and `landed_s` near CROSS_AT_S says X let go once the spinner ended.

    python benchmarks/probe_spinner_block.py [--cross] [CASE ...]   # each case under lazy and eager loading
"""

from __future__ import annotations

import faulthandler
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

HOLD_S = 3.0
CROSS_AT_S = 0.3


def _cases() -> dict[str, Callable[[], Callable[[], object]]]:
    """name -> prepare(); prepare returns X. Everything but X's first use happens in prepare."""
    import torch

    def control():
        a = torch.ones(1024, device="cuda")
        a.add_(1)
        return lambda: a.add_(1)

    def torch_argsort():
        a = torch.randint(0, 1000, (4096,), device="cuda")
        return lambda: torch.argsort(a, stable=True)

    def torch_topk():
        a = torch.rand(4096, device="cuda")
        return lambda: torch.topk(a, 64)

    def triton_double():
        import triton
        import triton.language as tl

        @triton.jit
        def double(x_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)
        return double, torch.ones(1024, device="cuda")

    def triton_first_call():
        double, a = triton_double()
        return lambda: double[(4,)](a, 1024, BLOCK=256)

    def triton_compiled_first_launch():
        double, a = triton_double()
        double.warmup(a, 1024, BLOCK=256, grid=(4,))     # compiled, not yet loaded
        return lambda: double[(4,)](a, 1024, BLOCK=256)

    def numba_first_launch():
        from numba import cuda

        @cuda.jit("void(float32[:])")
        def inc(x):
            i = cuda.grid(1)
            if i < x.size:
                x[i] += 1
        a = torch.ones(1024, device="cuda")
        arr = cuda.as_cuda_array(a)
        return lambda: inc[4, 256, cuda.external_stream(torch.cuda.current_stream().cuda_stream)](arr)

    def new_segment():
        return lambda: torch.empty(1 << 31, dtype=torch.uint8, device="cuda")

    def empty_cache():
        torch.empty(1 << 30, dtype=torch.uint8, device="cuda")      # freed into the cache at once
        return torch.cuda.empty_cache

    return {f.__name__: f for f in (control, empty_cache, torch_argsort, torch_topk, triton_first_call,
                                     triton_compiled_first_launch, numba_first_launch, new_segment)}


def _store_kernel():
    from numba import cuda

    from pulseio._cuda import _numba_compat  # noqa: F401
    from pulseio._cuda.launch import PackedKernel
    from pulseio._cuda.sysmem import store_release_sys

    def store_word(address, value):
        if cuda.threadIdx.x == 0:
            store_release_sys(address, value)
    return PackedKernel(cuda.jit("void(int64, int64)")(store_word), 2)


def run_case(name: str, cross: bool = False) -> dict:
    import numpy as np
    import torch

    from pulseio._cuda.driver import write_value
    from pulseio._cuda.wait_kernel import WaitLauncher

    torch.cuda.init()
    x = _cases()[name]()
    word = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    view = word.numpy()
    spin_stream = torch.cuda.Stream(priority=-1)
    consumer = torch.cuda.current_stream()
    waiter = WaitLauncher()
    probe = torch.zeros(1, dtype=torch.int64, pin_memory=True)      # warm the write and the wait kernel
    write_value(consumer.cuda_stream, probe.data_ptr(), 1)
    waiter(consumer.cuda_stream, probe.data_ptr(), 1)
    from pulseio._cuda import driver
    store, helper_stream, context = _store_kernel(), torch.cuda.Stream(priority=-1), driver.primary_context(0)
    store.values[0], store.values[1] = probe.data_ptr(), 2
    store.launch(helper_stream.cuda_stream, 1, 32)
    torch.cuda.synchronize()
    helper: dict[str, float] = {}

    def launch_from_helper() -> None:
        driver.set_current(context)
        store.values[0], store.values[1] = word.data_ptr(), 1
        t = time.perf_counter()
        store.launch(helper_stream.cuda_stream, 1, 32)
        helper["launch_s"] = time.perf_counter() - t

    waiter(spin_stream.cuda_stream, word.data_ptr(), 1)
    time.sleep(0.05)
    release = threading.Timer(HOLD_S, lambda: np.copyto(view, np.maximum(view, 1)))
    release.start()
    if cross:
        threading.Timer(CROSS_AT_S, launch_from_helper).start()
    start = time.perf_counter()
    x()
    launch_s = time.perf_counter() - start
    write_value(consumer.cuda_stream, word.data_ptr(), 5)
    landed_s = None
    while time.perf_counter() - start < HOLD_S + 5:
        if view[0] == 5:
            landed_s = time.perf_counter() - start
            break
        time.sleep(50e-6)
    release.cancel()
    torch.cuda.synchronize()
    return {"case": name, "loading": os.environ.get("CUDA_MODULE_LOADING", "<unset: torch's LAZY>"),
            "launch_s": round(launch_s, 4), "landed_s": None if landed_s is None else round(landed_s, 4),
            "waited_for_spinner": landed_s is None or landed_s > HOLD_S * 0.9,
            **({"helper_launch_s": round(helper.get("launch_s", -1), 4)} if cross else {})}


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        faulthandler.dump_traceback_later(60, exit=True)
        print(json.dumps(run_case(sys.argv[2], cross="--cross" in sys.argv)), flush=True)
        return
    cross = "--cross" in sys.argv
    names = [a for a in sys.argv[1:] if a != "--cross"] or list(_cases())
    for loading in (None, "EAGER"):
        for name in names:
            env = dict(os.environ)
            env.pop("CUDA_MODULE_LOADING", None)
            if loading:
                env["CUDA_MODULE_LOADING"] = loading
            try:
                child = [sys.executable, __file__, "--child", name, *(["--cross"] if cross else [])]
                proc = subprocess.run(child, env=env, capture_output=True, text=True, timeout=90)
                line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else \
                    json.dumps({"case": name, "loading": loading, "error": proc.stderr[-1500:]})
            except subprocess.TimeoutExpired:
                line = json.dumps({"case": name, "loading": loading, "error": "timed out after 90 s"})
            print(line, flush=True)


if __name__ == "__main__":
    main()
