"""Which call between post_recall and device_wait blocks the host behind a 1 s sleep on another stream?"""
import time, sys
import torch
sys.path.insert(0, ".")
import pulseio
from pulseio import Strategy
sys.path.insert(0, "tests/pulseio")
from test_runtime_gpu import CFG
rt = pulseio.open_runtime(CFG)
def t(label, fn):
    a = time.perf_counter(); r = fn(); print(f"{label:<28} {1e3*(time.perf_counter()-a):9.2f} ms", flush=True); return r
for rep in range(2):
    publish = torch.cuda.Stream()
    ids, slots = torch.arange(4, device="cuda"), torch.arange(8, 12, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(publish):
        torch.cuda._sleep(2_000_000_000)
    done = t("post_recall", lambda: rt.post_recall(host_ids=ids, device_slots=slots, stream=publish, strategy=Strategy.RESIDENT))
    graph = t("CUDAGraph()", torch.cuda.CUDAGraph)
    side = t("Stream()", torch.cuda.Stream)
    x = t("torch.ones", lambda: torch.ones(4, device="cuda"))
    with torch.cuda.stream(side):
        t("capture_begin", graph.capture_begin)
        y = t("x * 2", lambda: x * 2)
        try:
            t("device_wait", lambda: done.device_wait(side))
        except pulseio.InvalidRequestError as e:
            print("refused", str(e)[:60])
        t("capture_end", graph.capture_end)
    print("done:", done.wait(timeout=10))
rt.close()
