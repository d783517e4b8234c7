"""Where LayerOffloadCache's time goes on the GPU: pool writes, one recall, then generate() with stack dumps."""
import faulthandler, sys, time, os
sys.path.insert(0, os.getcwd())
faulthandler.dump_traceback_later(25, repeat=True)
import torch, transformers
import pulseio
from pulseio.integrations.transformers import LayerOffloadCache, cache_kwargs
sys.path.insert(0, "benchmarks")
import bench_transformers as bt

def t(msg, t0):
    torch.cuda.synchronize(); print(f"{msg}: {(time.perf_counter()-t0)*1e3:.1f} ms", flush=True)

ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
args = bt.parse_args(["--context", str(ctx)])
model = bt.build_model(args)
cfg = model.config
t0 = time.perf_counter(); cache = LayerOffloadCache(model, max_cache_len=ctx + 8); t("build", t0)
k = torch.randn(1, 8, ctx, 128, device="cuda", dtype=torch.bfloat16)
kt = torch.randn(1, ctx, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
for name, src in (("contig", k), ("transposed", kt)):
    for _ in range(2):
        t0 = time.perf_counter(); cache._host[0, 0, :, :, :ctx] = src; t(f"host write 64 MiB {name}", t0)
print("host pool strategy", cache.strategy, "available", cache._dma.available, flush=True)
for n in (512, ctx):
    for _ in range(3):
        t0 = time.perf_counter()
        tr = cache._recall(0, 1, n)
        t1 = time.perf_counter()
        tr.transfer.device_wait(); tr.waited = True
        t2 = time.perf_counter()
        torch.cuda.synchronize(); t3 = time.perf_counter()
        print(f"recall {n} tokens: submit {(t1-t0)*1e3:.2f} ms, device_wait {(t2-t1)*1e3:.2f} ms, "
              f"landed {(t3-t0)*1e3:.2f} ms ({2*8*n*128*2/(t3-t0)/1e9:.1f} GB/s)", flush=True)
cache.close()
prompt = torch.randint(0, cfg.vocab_size, (1, ctx), device="cuda")
from torch.profiler import profile, ProfilerActivity
for mode in ("default", "pulseio-layer"):
    c = 4096
    cache = LayerOffloadCache(model, max_cache_len=c + 8) if mode != "default" else None
    clock = bt.StepClock(torch.device("cuda"), cache)
    bt.generate(model, mode, prompt[:, :c], 4, cache, clock)
    s_ = clock.stamps
    print(f"{mode} ctx {c}: steps ms {[round((b-a)*1e3,1) for a,b in zip(s_, s_[1:])]}", flush=True)
    if cache is not None:
        cache.close()
        cache = LayerOffloadCache(model, max_cache_len=c + 8)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        bt.generate(model, mode, prompt[:, :c], 4, cache, None)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14), flush=True)
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=14), flush=True)
    if cache is not None:
        cache.close()
for c in (32768,):
    cache = LayerOffloadCache(model, max_cache_len=c + 8)
    clock = bt.StepClock(torch.device("cuda"), cache)
    t0 = time.perf_counter()
    try:
        out = bt.generate(model, "pulseio-layer", prompt[:, :c], 4, cache, clock)
    except Exception as exc:
        import traceback; traceback.print_exc()
    s = clock.stamps
    print(f"generate ctx {c}: prefill {(s[0]-t0)*1e3:.0f} ms, steps ms {[round((b-a)*1e3,1) for a,b in zip(s, s[1:])]}", flush=True)
    cache.close()
print("diag done", flush=True)
