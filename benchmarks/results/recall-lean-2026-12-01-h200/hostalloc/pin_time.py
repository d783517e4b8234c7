import sys, time, torch, pulseio
b = pulseio.open_backend("cuda")
for gib in (2, 40):
    t = time.perf_counter()
    p = pulseio.HostPool(b, num_blocks=gib * 16384, block_bytes=65536)
    t1 = time.perf_counter()
    p.blocks[::16384, :8] = 7
    p.close(); del p
    print(f"{sys.argv[1]}: HostPool {gib} GiB in {t1 - t:.1f} s; freed in {time.perf_counter() - t1:.1f} s", flush=True)
