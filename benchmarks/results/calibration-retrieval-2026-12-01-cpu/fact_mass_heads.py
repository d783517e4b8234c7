"""Prototype: score heads by attention mass on the fact's tokens at the answer positions (not the whole middle)."""
import json, sys
import torch, torch.nn.functional as F
sys.path.insert(0, ".")
from pulseio_engine.calibration import CalibrationConfig, retrieval_prompts, rank_heads
from pulseio_engine.fetch import fetch_model, fetch_shakespeare
from pulseio_engine.model.checkpoint import load_checkpoint
from pulseio_engine.model.llama import CausalLM
from pulseio_engine.model.layers import post_attention, pre_attention
torch.set_num_threads(2)
config = CalibrationConfig()
ckpt = load_checkpoint(str(fetch_model("smollm2")), dtype=torch.float32, device="cpu")
tok = ckpt.tokenizer
prompts = retrieval_prompts(tok.encode(fetch_shakespeare().read_text()), tok.encode, 8, 2048, config)
model = CausalLM(ckpt.config, ckpt.weights, max_len=2048); cfg, w = model.config, model.weights
out = []
with torch.no_grad():
    for p in prompts:
        ids = torch.tensor(p.ids); t = len(p.ids); group = cfg.num_heads // cfg.num_kv_heads
        x = F.embedding(ids, w.embed); per = []
        for lw in w.layers:
            q, k, v = pre_attention(x, torch.arange(t), model.rotary.cos, model.rotary.sin, lw.input_norm, lw.qkv, lw.qkv_bias,
                                    lw.q_norm, lw.k_norm, cfg.rms_norm_eps, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            probs = (torch.einsum("qhd,khd->hqk", q.float(), k.float()) * model.scale).masked_fill(
                ~torch.ones((t, t), dtype=torch.bool).tril(), -torch.inf).softmax(-1)
            per.append(probs[:, p.decode_from:, p.fact[0]:p.fact[1]].sum(-1).mean(-1).view(cfg.num_kv_heads, group).mean(1))
            x = post_attention(x, torch.einsum("hqk,khd->qhd", probs, v.float()).to(x.dtype), lw.o, lw.post_norm, lw.gate_up, lw.down, cfg.rms_norm_eps)
        out.append(torch.stack(per)); print("prompt", len(out), flush=True)
heads = rank_heads(torch.stack(out))
print("best ", list(heads.best)); print("worst", list(heads.worst)); print(heads.extra["agreement_best"], heads.extra["agreement_worst"])
from pathlib import Path; heads.save(Path("stage/cal/run/heads_smollm2_fact.json"))
