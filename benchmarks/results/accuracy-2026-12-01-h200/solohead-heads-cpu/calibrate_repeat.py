"""Experiment: middle-mass calibration on prompts whose second half repeats a stretch of the first half."""
import json, sys, torch
from pulseio_engine.calibration import CalibrationConfig, calibrate, calibration_prompts
from pulseio_engine.fetch import fetch_model, fetch_shakespeare
from pulseio_engine.model.checkpoint import load_checkpoint
from pulseio_engine.model.llama import CausalLM
torch.set_num_threads(2)
L = 2048
ckpt = load_checkpoint(str(fetch_model("smollm2")), dtype=torch.float32, device="cpu")
toks = ckpt.tokenizer.encode(fetch_shakespeare().read_text())
model = CausalLM(ckpt.config, ckpt.weights, max_len=L)
cfg = CalibrationConfig()
plain = calibration_prompts(toks, 8, L)
def repeat(p):  # first half: text; second half: a copy of a stretch from the first half's middle
    half = L // 2
    return p[:half] + p[half // 4: half // 4 + half]
rep = [repeat(p) for p in plain]
out = {}
for name, prompts in (("plain", plain), ("repeat", rep)):
    h = calibrate(model, prompts, cfg)
    out[name] = {"best": list(h.best), "worst": list(h.worst), **{k: v for k, v in h.extra.items() if k.startswith("agree")}}
    print(name, out[name], flush=True)
ref = json.load(open("benchmarks/results/accuracy-2026-11-30-h200/heads_smollm2.json"))
reader = {7: 1, 18: 2, 21: 2, 28: 0}
for name in out:
    b = out[name]["best"]
    print(name, "reader layers:", {l: (b[l], r) for l, r in reader.items()}, "same as shipped:", sum(x == y for x, y in zip(b, ref["best"])), "/", len(b))
json.dump(out, open("/tmp/probe/calib_exp.json", "w"))
