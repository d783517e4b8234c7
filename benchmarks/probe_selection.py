"""Which blocks Quest and SoloHead pick, per layer and KV head, against the needle and the dense oracle.

Usage (repo root, CPU): PYTHONPATH=. python benchmarks/probe_selection.py --mode quest --token-budget 512 \
    --samples 0 1 2 3 --heads benchmarks/results/accuracy-2026-11-30-cpu/heads_smollm2.json --json out.json

Runs samples of `--task` (niah-single, the default; common-words; variable-tracking) through the engine
exactly as `pulseio-engine eval` does (same engine, same sample generator, the question decoded token by
token through the sparse path) in `--mode` (the trajectory), and at each of the first `--answer-steps`
decode steps that produce answer tokens, for every offloaded layer and KV head h, rebuilds the request's
whole KV from the host store and measures:

- oracle: the K blocks (sink + local forced, as `select_blocks` does) with the most dense attention mass of
  h's query group (softmax of each query head over the whole context, averaged over the group);
- quest: the blocks h's own Quest bound picks (digests recomputed from the host keys, checked equal to the
  engine's); solo / rev: the blocks the calibration's best / worst head of the layer picks for all heads
  (from the same queries: what SoloHead would pick on this trajectory); qmax: h's query heads combined by
  the max of their own Quest bounds instead of their sum (an alternative GQA grouping, never used by the engine);
- per selection: middle recall (selected middle blocks that are oracle middle blocks / oracle middle
  blocks), captured mass (h's dense mass on the selected blocks; the oracle's own is the most any selection
  of this budget captures), and, on niah-single, whether every needle block (the blocks holding the
  needle's digits) is in it; per head (niah-single): dense mass on the needle, and the Quest rank of the
  needle blocks among the middle blocks. The other tasks have no single needle span: no needle columns.

Columns of the printed table (means over samples, steps and KV heads; `reader_*`: only the KV head with the
most dense mass on the needle at that step): needle_mass, reader_mass; reader_rank (Quest rank of the needle
among the middle blocks, for the reader); X_needle (needle selected by X); X_recall (oracle middle recall);
forced_mass (dense mass on the sink and local blocks, which every selection holds), oracle_mass, X_mass
(captured dense mass). Other tasks: the recall and mass columns only. `--share-best L ...` is an
intervention: in quest mode, layers L select for every KV head with the calibration's best head (SoloHead's
selection in those layers only).

It also checks the engine on the way: the trajectory's `Offloader.last_selection` equals the recomputed
selection of its mode, and in quest mode each query head's sparse attention output equals plain attention
of that query head over its KV head's (h = g // (Hq / Hkv)) selected tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run without PYTHONPATH too

from pulseio_engine.evaluation.run import EvalConfig, EvalMode, Prompt, eval_engine, load_eval_checkpoint, make_prompts  # noqa: E402
from pulseio_engine.evaluation.tasks import Task, make_sample, string_match_all  # noqa: E402
from pulseio_engine.kv.retrieval_heads import RetrievalHeads  # noqa: E402
from pulseio_engine.kv.selection import block_scores, head_bounds, select_blocks  # noqa: E402
from pulseio_engine.offload import OffloadBatch  # noqa: E402
from pulseio_engine.request import SamplingParams  # noqa: E402


def needle_tokens(tok, context: str, answer: str) -> tuple[int, int]:  # noqa: ANN001
    """Token span [start, end) of the answer's digits in the encoded context."""
    at = context.index(answer)
    start, end = len(tok.encode(context[:at])), len(tok.encode(context[:at + len(answer)]))
    got = tok.decode(tok.encode(context)[start:end]).strip()
    if got != answer:
        raise RuntimeError(f"needle span decodes to {got!r}, not {answer!r}")
    return start, end


def full_kv(batch: OffloadBatch, li: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request 0's whole KV of offloaded layer li from the host store -> k, v: [n, Hkv, D]."""
    host = batch.owner.store.host                                     # [units, 2, bs, hg, D]
    nb = -(-n // host.shape[2])
    units = host[batch.host_map[0, li, :, :nb]]                       # [S, nb, 2, bs, hg, D]
    kv = units.permute(1, 2, 3, 0, 4, 5).flatten(3, 4)                # [nb, 2, bs, Hkv, D]
    return kv[:, 0].flatten(0, 1)[:n], kv[:, 1].flatten(0, 1)[:n]


class Probe:
    """Wraps `OffloadBatch.attend` and records per-(layer, head) selection statistics at chosen steps."""

    def __init__(self, heads: RetrievalHeads, mode: EvalMode, share: dict[int, int] | None = None) -> None:
        """share: layer -> the KV head whose Quest selection every KV head of that layer uses (quest mode)."""
        self.heads, self.mode, self.share = heads, mode, dict(share or {})
        self.records: list[dict] = []
        self.record_from: int | None = None     # position of the first step to record (None: record nothing)
        self.needle: tuple[int, int] | None = None      # the needle's token span; None: a task without one
        self.sample = -1
        self.max_err = 0.0
        original = OffloadBatch.attend

        def attend(batch: OffloadBatch, layer: int, q, k, v):  # noqa: ANN001, ANN202
            out = original(batch, layer, q, k, v)
            position = int(batch.num_tokens[0]) - 1
            if self.record_from is not None and position >= self.record_from:
                self.observe(batch, layer, q, out, position)
            return out

        OffloadBatch.attend = attend

    def attach(self, engine) -> None:  # noqa: ANN001
        """Wrap the engine's selector with the intervention (see --share-best / --share-head)."""
        select, share = engine.offloader.selector, self.share

        def select_shared(layer, q, *args):  # noqa: ANN001, ANN202
            selected = select(layer, q, *args)                                        # [B, S, K]
            if layer not in share or selected.shape[1] == 1:
                return selected
            h = share[layer]
            return selected[:, h:h + 1].expand_as(selected).contiguous()

        engine.offloader.selector = select_shared

    def observe(self, batch: OffloadBatch, layer: int, q: torch.Tensor, out: torch.Tensor, position: int) -> None:
        o = batch.owner
        sparse, bs, li = o.sparse, o.sparse.block_size, layer - o.dense
        n = position + 1
        k, v = full_kv(batch, li, n)                                                  # [n, Hkv, D]
        hkv, d = k.shape[1], k.shape[2]
        nb = -(-n // bs)
        pad = torch.cat([k, k[-1:].expand(nb * bs - n, -1, -1)])                      # repeat: max/min unchanged
        blocks = pad.view(nb, bs, hkv, d)
        dmax, dmin = blocks.amax(1)[None], blocks.amin(1)[None]                       # [1, nb, Hkv, D]
        if o.digests.width == hkv:                                                    # quest: engine's digests
            emax, emin = o.digests.gather(layer, batch.block_tables[:1, :nb])
            assert torch.equal(emax, dmax) and torch.equal(emin, dmin), "digests differ from the host keys"
        num_tokens = torch.tensor([n])
        scores = block_scores(q[:1], hkv, None, dmax, dmin, num_tokens, bs, sparse.group_score)   # [1, Hkv, nb]
        per_head = head_bounds(q[:1], hkv, None, dmax, dmin)                          # [1, Hkv, G, nb]
        quest = select_blocks(scores, num_tokens, sparse)[0]                          # [Hkv, K]
        group = q.shape[1] // hkv
        qf = q[0].float().view(hkv, group, d)                                         # [Hkv, G, D]
        qmax = select_blocks(per_head[0].amax(1)[None], num_tokens, sparse)[0]        # group by plain max
        best, worst = self.heads.best[layer], self.heads.worst[layer]
        engine_sel = o.last_selection[layer][0]
        want = {EvalMode.QUEST: quest, EvalMode.SOLOHEAD: quest[best:best + 1],
                EvalMode.SOLOHEAD_REVERSED: quest[worst:worst + 1]}[self.mode]
        if self.mode is EvalMode.QUEST and layer in self.share:
            want = quest[self.share[layer]:self.share[layer] + 1].expand_as(quest)
        assert torch.equal(engine_sel, want), f"engine selection differs at layer {layer} position {position}"
        logits = torch.einsum("hgd,nhd->hgn", qf, k.float()) * o.scale                # [Hkv, G, n]
        probs = torch.softmax(logits, dim=-1)
        mass = torch.nn.functional.pad(probs.mean(1), (0, nb * bs - n)).view(hkv, nb, bs).sum(-1)   # [Hkv, nb]
        oracle = select_blocks(mass[None], num_tokens, sparse)[0]                      # [Hkv, K]
        forced = set(range(sparse.sink_blocks)) | set(range(nb - sparse.local_blocks, nb))
        needle = set(range(self.needle[0] // bs, (self.needle[1] - 1) // bs + 1)) if self.needle else None
        middle_ids = torch.tensor(sorted(set(range(nb)) - forced))
        for h in range(hkv):
            top = {b for b in oracle[h].tolist() if b >= 0}
            orc = top - forced
            rec = {"sample": self.sample, "position": position, "layer": layer, "head": h, "best": best,
                   "worst": worst, "forced_mass": float(mass[h, sorted(forced)].sum()),
                   "oracle_mass": float(mass[h, sorted(top)].sum())}
            for name, sel in (("quest", quest[h]), ("solo", quest[best]), ("rev", quest[worst]), ("qmax", qmax[h])):
                chosen = {b for b in sel.tolist() if b >= 0}
                rec[f"{name}_recall"] = len((chosen - forced) & orc) / max(1, len(orc))
                rec[f"{name}_mass"] = float(mass[h, sorted(chosen)].sum())
                if needle is not None:
                    rec[f"{name}_needle"] = needle <= chosen
            self.records.append(rec)
            if needle is None:
                continue
            rec["needle_mass"] = float(mass[h, sorted(needle)].sum())
            middle = scores[0, h, middle_ids]
            ranks = [int((middle > scores[0, h, b]).sum()) + 1 for b in sorted(needle) if b not in forced]
            rec["quest_needle_rank"] = max(ranks) if ranks else 0
            worst_needle = min(float(scores[0, h, b]) for b in needle)          # the needle block scored lowest
            rec["quest_needle_z"] = float((worst_needle - middle.mean()) / middle.std())
            rec["oracle_needle"] = needle <= set(oracle[h].tolist())
        if self.mode is EvalMode.QUEST:                          # each query head attends over its own KV head
            for g in range(q.shape[1]):
                h = g // group
                chosen = torch.tensor([b for b in want[h].tolist() if b >= 0])
                keep = torch.isin(torch.arange(n) // bs, chosen)
                p = torch.softmax(logits[h, g % group].masked_fill(~keep, -torch.inf), dim=-1)
                ref = p @ v[:, h].float()
                self.max_err = max(self.max_err, float((out[0, g].float() - ref).abs().max()))


def run_sample(engine, probe: Probe, p: Prompt, context_len: int, answer_steps: int) -> dict:  # noqa: ANN001
    """p: `make_prompts`' sample (seed 0, as `pulseio-engine eval`); the text again to check it and, on
    niah-single, for the needle's span."""
    tok, index = engine.tokenizer, p.index
    sample = make_sample(p.task, context_len=context_len, seed=index, count_tokens=lambda text: len(tok.encode(text)))
    probe.needle = needle_tokens(tok, sample.context, sample.answers[0]) if p.task is Task.NEEDLE_SINGLE else None
    if tok.encode(sample.context) != list(p.ids[:len(p.ids) - p.tail]):
        raise RuntimeError(f"sample {index}: the context differs from make_prompts' sample")
    probe.sample = index
    prompt = list(p.ids)
    probe.record_from = len(prompt) - 1                 # the step that feeds the last question token
    engine.add_request(prompt, SamplingParams(max_new_tokens=p.max_new_tokens), offload=True, decode_tail=p.tail)
    seq = engine.scheduler.waiting[-1]
    while engine.has_unfinished():
        if seq.num_computed >= len(prompt) - 1 + answer_steps:
            probe.record_from = None
        engine.step()
    text, bs = tok.decode(seq.token_ids[len(prompt):]), engine.offloader.sparse.block_size
    result = {"index": index, "prompt_tokens": len(prompt), "output": text,
              "score": string_match_all(text, sample.answers)}
    if probe.needle is not None:
        result |= {"needle_tokens": list(probe.needle),
                   "needle_blocks": [probe.needle[0] // bs, (probe.needle[1] - 1) // bs]}
    return result


SELECTORS = ("quest", "solo", "rev", "qmax")
TASKS = (Task.NEEDLE_SINGLE, Task.COMMON_WORDS, Task.VARIABLE_TRACKING)


def per_layer(records: list[dict]) -> list[dict]:
    """Means over samples, steps and KV heads, per layer (and 'all'); `reader`: the KV head with the most
    dense mass on the needle at each (sample, step, layer). Needle columns only for records that have them."""
    needle = "needle_mass" in records[0]
    top: dict[tuple, float] = defaultdict(float)
    for r in records if needle else ():
        key = (r["sample"], r["position"], r["layer"])
        top[key] = max(top[key], r["needle_mass"])
    by_layer: dict[object, list[dict]] = defaultdict(list)
    for r in records:
        by_layer[r["layer"]].append(r)
        by_layer["all"].append(r)
    rows = []
    for layer in sorted(k for k in by_layer if k != "all") + ["all"]:
        rs = by_layer[layer]
        mean = lambda key, sub: round(sum(float(r[key]) for r in sub) / len(sub), 3)   # noqa: E731
        row = {"layer": layer}
        if needle:
            reader = [r for r in rs if r["needle_mass"] == top[(r["sample"], r["position"], r["layer"])]]
            row |= {"needle_mass": mean("needle_mass", rs), "reader_mass": mean("needle_mass", reader),
                    "reader_rank": mean("quest_needle_rank", reader)}
            for name in SELECTORS:
                row[f"{name}_needle"] = mean(f"{name}_needle", rs)
                row[f"reader_{name}_needle"] = mean(f"{name}_needle", reader)
        for name in SELECTORS:
            row[f"{name}_recall"] = mean(f"{name}_recall", rs)
        row["forced_mass"], row["oracle_mass"] = mean("forced_mass", rs), mean("oracle_mass", rs)
        for name in SELECTORS:
            row[f"{name}_mass"] = mean(f"{name}_mass", rs)
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--task", choices=[t.value for t in TASKS], default=Task.NEEDLE_SINGLE.value)
    p.add_argument("--mode", choices=[m.value for m in EvalMode if m is not EvalMode.VANILLA], default="quest")
    p.add_argument("--token-budget", type=int, default=512)
    p.add_argument("--context-len", type=int, default=2048)
    p.add_argument("--samples", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--answer-steps", type=int, default=4, help="decode steps recorded from the last question token")
    p.add_argument("--heads", type=Path, required=True, help="retrieval-head JSON of `calibrate`")
    p.add_argument("--share-best", type=int, nargs="*", default=[],
                   help="quest mode, an intervention: in these layers every KV head uses the best head's selection")
    p.add_argument("--share-head", nargs="*", default=[], metavar="L:H",
                   help="quest mode: in layer L every KV head uses KV head H's selection (overrides --share-best)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    heads = RetrievalHeads.load(args.heads)
    mode, task = EvalMode(args.mode), Task(args.task)
    config = EvalConfig(task, args.context_len, len(args.samples), mode, args.token_budget)
    share = {layer: heads.best[layer] for layer in args.share_best}
    share.update(dict(map(int, s.split(":")) for s in args.share_head))
    if share and mode is not EvalMode.QUEST:
        raise SystemExit("--share-best / --share-head need --mode quest (the engine keeps every head's digests)")
    ckpt = load_eval_checkpoint(args.model, "cpu")
    prompts = make_prompts(ckpt.tokenizer, task, args.context_len, max(args.samples) + 1, config.seed)
    probe = Probe(heads, mode, share)
    samples = []
    with eval_engine(ckpt, config, heads=heads, device="cpu", batch=1) as engine:
        probe.attach(engine)
        for index in args.samples:
            samples.append(run_sample(engine, probe, prompts[index], args.context_len, args.answer_steps))
            print(json.dumps(samples[-1]), flush=True)
    score = sum(r["score"] for r in samples) / len(samples)
    print(f"score {score:.2f} over {len(samples)} samples")
    layers = per_layer(probe.records) if probe.records else []
    if layers:
        print(markdown(layers))
    print(f"max |engine - reference| attention output (quest mode only): {probe.max_err:.2e}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "score": score,
                                         "samples": samples,
                                         "layers": layers, "records": probe.records, "max_err": probe.max_err}))


if __name__ == "__main__":
    main()
