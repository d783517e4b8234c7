"""LayerOffloadCache on the GPU: host time inside update() per layer, step times at 4K and 32K vs the default."""
import faulthandler, sys, time, os
sys.path.insert(0, os.getcwd())
faulthandler.dump_traceback_later(40, repeat=True)
import torch
from pulseio.integrations.transformers import LayerOffloadCache
sys.path.insert(0, "benchmarks")
import bench_transformers as bt

args = bt.parse_args(["--context", "32768"])
model = bt.build_model(args)
cfg = model.config
spent = [0.0, 0]
real = LayerOffloadCache.update
def timed(self, *a, **k):
    t0 = time.perf_counter(); out = real(self, *a, **k); spent[0] += time.perf_counter() - t0; spent[1] += 1; return out
LayerOffloadCache.update = timed
prompt = torch.randint(0, cfg.vocab_size, (1, 32768), device="cuda")
import pulseio
for c in (32768,):
    for mode in ("default", "pulseio-layer", "inline"):
        cache = None if mode == "default" else LayerOffloadCache(model, max_cache_len=c + 16, dma=None if mode != "inline" else pulseio.DmaConfig(staging_bytes=1 << 20, staging_buffers=2, inline_issue=True))
        clock = bt.StepClock(torch.device("cuda"), cache)
        spent[:] = [0.0, 0]
        t0 = time.perf_counter()
        try:
            bt.generate(model, "default" if mode == "default" else "pulseio-layer", prompt[:, :c], 8, cache, clock)
        except Exception:
            import traceback; traceback.print_exc()
        s = clock.stamps
        steps = [round((b - a) * 1e3, 1) for a, b in zip(s, s[1:])]
        extra = ""
        if cache is not None:
            st = cache.statistics()
            extra = f"; update() {spent[0] / max(spent[1], 1) * 1e6:.0f} us/call over {spent[1]} calls, runs {st.recall_runs}, " \
                    f"recalled {st.bytes_recalled / 2**30:.2f} GiB"
            cache.close()
        print(f"{mode} ctx {c}: prefill {(s[0] - t0) * 1e3:.0f} ms, steps ms {steps}{extra}", flush=True)
# does a batched copy call block while the copy engine is busy? three 129 MiB recalls back to back
cache = LayerOffloadCache(model, max_cache_len=32784, dma=pulseio.DmaConfig(staging_bytes=1 << 20, staging_buffers=2, inline_issue=True))
for _ in range(2):
    times = []
    torch.cuda.synchronize()
    for layer in range(3):
        t0 = time.perf_counter(); cache._dma.submit(cache._plan(layer, layer % 2, 128)); times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    print("back-to-back batched submits ms", [round(x, 2) for x in times], flush=True)
cache.close()
print("diag done", flush=True)
