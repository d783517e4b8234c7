"""Experiment: rank KV heads by the attention the answer tokens put on a planted fact (retrieval-shaped prompts
from the Shakespeare text, a template unlike the evaluation's needle)."""
import json, random, torch
import torch.nn.functional as F
from pulseio_engine.fetch import fetch_model, fetch_shakespeare
from pulseio_engine.model.checkpoint import load_checkpoint
from pulseio_engine.model.llama import CausalLM
from pulseio_engine.model.layers import post_attention, pre_attention
torch.set_num_threads(2)
L = 2048
ckpt = load_checkpoint(str(fetch_model("smollm2")), dtype=torch.float32, device="cpu")
tok = ckpt.tokenizer
text = tok.encode(fetch_shakespeare().read_text())
model = CausalLM(ckpt.config, ckpt.weights, max_len=L + 64)
rng = random.Random(7)
WORDS = ["lantern", "harbor", "violet", "granite", "falcon", "meadow", "copper", "thistle"]

def prompt(i):
    word, code = WORDS[i % len(WORDS)], str(rng.randrange(10**6, 10**7))
    fact = tok.encode(f" The password of the {word} cellar is {code}. ")
    start = rng.randrange(0, len(text) - L)
    body = text[start:start + L - 80]
    at = rng.randrange(100, len(body) - 200)
    question = tok.encode(f" What is the password of the {word} cellar? The password of the {word} cellar is")
    answer = tok.encode(f" {code}.")
    ids = body[:at] + fact + body[at:] + question + answer
    return torch.tensor(ids), range(at, at + len(fact)), range(len(ids) - len(answer) - 1, len(ids) - 1)

@torch.no_grad()
def needle_mass(ids, fact, queries):
    c, w = model.config, model.weights
    t, group = ids.shape[0], c.num_heads // c.num_kv_heads
    pos = torch.arange(t); causal = torch.ones((t, t), dtype=torch.bool).tril()
    x = F.embedding(ids, w.embed); out = []
    q_idx = torch.tensor(list(queries)); f = torch.zeros(t); f[list(fact)] = 1
    for lw in w.layers:
        q, k, v = pre_attention(x, pos, model.rotary.cos, model.rotary.sin, lw.input_norm, lw.qkv, lw.qkv_bias,
                                lw.q_norm, lw.k_norm, c.rms_norm_eps, c.num_heads, c.num_kv_heads, c.head_dim)
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        probs = (torch.einsum("qhd,khd->hqk", q.float(), k.float()) * model.scale).masked_fill(~causal, -torch.inf).softmax(-1)
        m = (probs[:, q_idx] * f).sum(-1).mean(-1).view(c.num_kv_heads, group).mean(1)     # [Hkv]
        out.append(m)
        attn = torch.einsum("hqk,khd->qhd", probs, v.float())
        x = post_attention(x, attn, lw.o, lw.post_norm, lw.gate_up, lw.down, c.rms_norm_eps)
    return torch.stack(out)

masses = torch.stack([needle_mass(*prompt(i)) for i in range(8)])      # [P, L, Hkv]
mean = masses.mean(0)
best = mean.argmax(1).tolist()
halves = masses[0::2].mean(0).argmax(1), masses[1::2].mean(0).argmax(1)
print("best", best); print("agreement", float((halves[0] == halves[1]).float().mean()))
reader = {7: 1, 18: 2, 21: 2, 28: 0}
print("reader layers (chosen, reader):", {l: (best[l], r) for l, r in reader.items()})
ref = json.load(open("benchmarks/results/accuracy-2026-11-30-h200/heads_smollm2.json"))
print("same as shipped:", sum(x == y for x, y in zip(best, ref["best"])), "/", len(best))
print("needle mass by head, layers 7 18 21 23 28:", [[round(float(x), 3) for x in mean[l]] for l in (7, 18, 21, 23, 28)])
worst = mean.argmin(1).tolist()
json.dump({"num_kv_heads": 3, "best": best, "worst": worst, "needle_mass": mean.tolist(),
           "agreement_best": float((halves[0] == halves[1]).float().mean())}, open("/tmp/probe/needle.json", "w"))
