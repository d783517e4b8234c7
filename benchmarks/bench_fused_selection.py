"""One sparse layer's selection on one GPU: the fused score and select kernels against the torch path they
replace, at the shape of the issue (qwen3-14b: 40 q / 8 KV heads, head_dim 128; 8 requests x 32K tokens,
block 16: NB = 2048; budget 2048 tokens: K = 128).

Usage (repo root): PYTHONPATH=. python benchmarks/bench_fused_selection.py [--batch 8] [--context 32768]
    [--parts score,select,torch,halves] [--only "S=8 paged sum"]

Workload: bf16 queries and digests with random values, block tables of shuffled physical ids, every
request at the full context; the select runs on the score kernel's bounds of them (the threshold search's
steps depend on the keys: it skips the digits every member shares). Each line is the median of 15 CUDA-graph
replays of 10 back-to-back calls (what a captured decode step sees), per call. Score lines give the digest
bytes read (max and min of every block column of every selecting row) per second, and that against a 1 GiB
device copy (read + write bytes, `bench_attention.measure_copy_gbps`) timed in the same process. HOT select runs
steered (overlap 0.9) so each call recalls ~a tenth of K, as real models do; its recall buffers are sized so the
replays never run past them.
`--context 32800` gives a table of 2050 blocks, as in the engine's step, whose select runs as a row of 2048 columns and
a tail of 256.
`halves`: Quest's whole sparse chain of one all-on-GPU layer (score, select, attention over the selected pages in
place), as the step runs it and as two halves of the requests on two streams, the second half scored once the first
is: its select (one CTA a row, the GPU mostly idle) then runs beside the other half's score, its attention beside the
other's select. Each piece alone is timed too. The engine once ran its layers so (`OffloadConfig.stagger`, taken
out): no faster in the step on an H100 and slower on the H200 (benchmarks/results/sparse-step-2026-12-07-h200/).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run without PYTHONPATH too

from bench_attention import measure_copy_gbps, time_graph_us  # noqa: E402  (its directory, benchmarks/, is sys.path[0])

from pulseio_engine.attention import paged_decode_attention  # noqa: E402
from pulseio_engine.config import GroupScore, SparseConfig  # noqa: E402
from pulseio_engine.kv import select_kernels  # noqa: E402
from pulseio_engine.kv.digests import BlockDigests  # noqa: E402
from pulseio_engine.kv.fused_selection import HotRecall, NewToken, Steering  # noqa: E402
from pulseio_engine.kv.recall import compact  # noqa: E402
from pulseio_engine.kv.residency import apply_recall, plan_recall  # noqa: E402
from pulseio_engine.kv.selection import select_for_layer  # noqa: E402

HQ, HKV, D, BS = 40, 8, 128, 16


class Layer:
    """One layer's digests, queries, tables and a HOT row state per selecting-row count S."""

    def __init__(self, batch: int, context: int, budget: int) -> None:
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.b, self.nb, self.k = batch, context // BS, budget // BS
        n_phys = batch * self.nb + 8
        bf16 = dict(dtype=torch.bfloat16, device="cuda")
        self.q = torch.randn((batch, HQ, D), generator=gen, **bf16)
        self.dmax = torch.randn((n_phys, HKV, D), generator=gen, **bf16)
        self.dmin = self.dmax - torch.rand((n_phys, HKV, D), generator=gen, **bf16)
        self.solo_max, self.solo_min = self.dmax[:, 3:4].contiguous(), self.dmin[:, 3:4].contiguous()
        perm = torch.randperm(n_phys, generator=gen, device="cuda")[: batch * self.nb]
        self.tables = perm.view(batch, self.nb).int()
        self.num_tokens = torch.full((batch,), context, device="cuda")
        self.config = SparseConfig(token_budget=budget, block_size=BS)

    def bounds(self, s: int, c: int) -> torch.Tensor:
        """The score kernel's bounds for S selecting rows (Quest's 8, or SoloHead's head 3) by C heads."""
        out = torch.empty((self.b, s, c, self.nb), device="cuda")
        dmax, dmin, head = (self.dmax, self.dmin, None) if s == HKV else (self.solo_max, self.solo_min, 3)
        select_kernels.launch_score(self.q, dmax, dmin, self.tables, out, None, num_kv_heads=HKV, head=head,
                                    max_norm=c > 1)
        return out

    def hot(self, s: int, calls: int = 256) -> tuple[HotRecall, dict[str, torch.Tensor]]:
        b, k, nb, dev = self.b, self.k, self.nb, "cuda"
        long = dict(dtype=torch.int64, device=dev)
        hg = HKV // s
        pool = torch.zeros((1 + b * s * k, 2, BS, hg, D), dtype=torch.bfloat16, device=dev)
        kv = torch.randn((2, b, HKV, D), dtype=torch.bfloat16, device=dev)
        hot = HotRecall(resident=torch.full((b, s, nb), -1, **long), owner=torch.full((b, s, k), -1, **long),
                        hot=1 + torch.arange(b * s * k, device=dev).view(b, s, k),
                        age=torch.zeros((b, s, k), dtype=torch.int32, device=dev),
                        host_map=torch.arange(b * s * nb, **long).view(b, s, nb),
                        recall_ids=torch.zeros(b * s * k * calls, **long),
                        recall_dst=torch.zeros(b * s * k * calls, **long), count=torch.zeros(1, **long),
                        write_slot=torch.zeros((b, s), **long), new_token=NewToken(kv[0], kv[1], pool))
        outs = {"mask": torch.zeros((b, s, nb), dtype=torch.uint8, device=dev),
                "table": torch.empty((b, s, k), dtype=torch.int32, device=dev),
                "context_lens": torch.empty((b, s), dtype=torch.int32, device=dev),
                "out": torch.empty((b, s, k), **long)}
        return hot, outs


def bench_score(layer: Layer, copy_gbps: float) -> None:
    b, nb = layer.b, layer.nb
    for label, dmax, dmin, head, rule in (("quest sum", layer.dmax, layer.dmin, None, GroupScore.SUM),
                                          ("quest max-norm", layer.dmax, layer.dmin, None, GroupScore.MAX_NORM),
                                          ("solohead sum W=1", layer.solo_max, layer.solo_min, 3, GroupScore.SUM)):
        s, c = (HKV if head is None else 1), (1 if rule is GroupScore.SUM else HQ // HKV)
        out = torch.empty((b, s, c, nb), dtype=torch.float32, device="cuda")
        nbytes = b * s * nb * D * 2 * dmax.element_size()
        for tile, warps in ((None, None), (32, 4), (64, 4), (64, 8), (128, 8)):
            us = time_graph_us(lambda: select_kernels.launch_score(
                layer.q, dmax, dmin, layer.tables, out, None, num_kv_heads=HKV, head=head,
                max_norm=rule is GroupScore.MAX_NORM, tile=tile, num_warps=warps))
            gbps = nbytes / us / 1e3
            print(f"score {label:18s} tile {tile or 'auto':>4} warps {warps or 'auto':>4}: {us:8.1f} us "
                  f"{nbytes / 2**20:6.1f} MiB {gbps:7.0f} GB/s ({gbps / copy_gbps:4.0%} of the copy)", flush=True)


def bench_select(layer: Layer, only: list[str]) -> None:
    """only: substrings of the lines' labels ("S=8 paged sum") to run; empty runs every configuration."""
    config = layer.config
    maxnorm = SparseConfig(token_budget=config.token_budget, block_size=BS, group_score=GroupScore.MAX_NORM)
    for s in (HKV, 1):
        for label, mode, cfg, c in (("paged sum", "paged", config, 1), ("hot sum", "hot", config, 1),
                                    ("hot sum steered", "steer", config, 1),
                                    ("hot max-norm steered", "steer", maxnorm, HQ // HKV)):
            if only and not any(o in f"S={s} {label}" for o in only):
                continue
            for warps in (None, 4, 8, 16):
                bounds = layer.bounds(s, c)
                hot, outs = layer.hot(s)
                calls = torch.zeros((layer.b, s), dtype=torch.int64, device="cuda")
                steer = Steering(0.9, calls, seed=1, layer=3) if mode == "steer" else None
                kw = dict(block_tables=layer.tables) if mode == "paged" else dict(hot=hot)

                def run() -> None:
                    select_kernels.launch_select(bounds, layer.num_tokens, cfg, outs["out"], outs["mask"],
                                                 outs["table"], outs["context_lens"], kw.get("block_tables"),
                                                 kw.get("hot"), steer, num_warps=warps)

                us = time_graph_us(run)
                print(f"select S={s} {label:22s} warps {warps or 'auto':>4}: {us:8.1f} us", flush=True)


def bench_torch_path(layer: Layer) -> None:
    """What a layer did before the fused kernels: select_for_layer (gathered digests, fp32, sorts),
    plan_recall, compact, apply_recall and the table gather (the selection part of the old prepare + finish)."""
    for label, heads, s in (("quest", None, HKV), ("solohead", (3,), 1)):
        digests = BlockDigests(num_layers=1, num_blocks=layer.dmax.shape[0], num_kv_heads=HKV, head_dim=D,
                               block_size=BS, dtype=torch.bfloat16, device="cuda", heads=heads)
        digests.max[0].copy_(layer.dmax if heads is None else layer.solo_max)
        digests.min[0].copy_(layer.dmin if heads is None else layer.solo_min)
        hot, _ = layer.hot(s, calls=1)
        b, k, nb = layer.b, layer.k, layer.nb
        tables = layer.tables.long()

        def run() -> None:
            selected = select_for_layer(digests, 0, layer.q, tables, layer.num_tokens, layer.config)
            rows, resident = selected.reshape(b * s, k), hot.resident.view(b * s, nb)
            plan = plan_recall(rows, resident, k)
            slots = hot.hot.view(b * s, k)
            compact(hot.host_map.view(b * s, nb).gather(1, plan.blocks.clamp(min=0)),
                    slots.gather(1, plan.slots.clamp(min=0)), plan.blocks >= 0)
            hot.resident.view(b * s, nb).copy_(apply_recall(resident, plan))
            slots.gather(1, plan.selected_slots.clamp(min=0))

        us = time_graph_us(run)
        print(f"torch path {label:10s} (select_for_layer + plan + compact + apply): {us:8.1f} us", flush=True)


class QuestChain:
    """One Quest all-on-GPU layer's score -> select -> attention over `layer`'s digests and random KV pages, each
    step over a slice of the requests (default all), into buffers of its own."""

    def __init__(self, layer: Layer) -> None:
        b, s, k, nb = layer.b, HKV, layer.k, layer.nb
        gen = torch.Generator(device="cuda").manual_seed(1)
        kv = torch.randn((layer.dmax.shape[0], 2, BS, HKV, D), generator=gen, dtype=torch.bfloat16, device="cuda")
        self.layer, self.k_cache, self.v_cache = layer, kv[:, 0], kv[:, 1]
        self.bounds = torch.empty((b, s, 1, nb), dtype=torch.float32, device="cuda")
        self.out = torch.empty((b, s, k), dtype=torch.int64, device="cuda")
        self.mask = torch.zeros((b, s, nb), dtype=torch.uint8, device="cuda")
        self.table = torch.zeros((b, s, k), dtype=torch.int32, device="cuda")
        self.context_lens = torch.ones((b, s), dtype=torch.int32, device="cuda")
        self.attn = torch.empty_like(layer.q)

    def score(self, rows: slice = slice(None)) -> None:
        lay = self.layer
        select_kernels.launch_score(lay.q[rows], lay.dmax, lay.dmin, lay.tables[rows], self.bounds[rows], None,
                                    num_kv_heads=HKV, head=None, max_norm=False)

    def select(self, rows: slice = slice(None)) -> None:
        lay = self.layer
        select_kernels.launch_select(self.bounds[rows], lay.num_tokens[rows], lay.config, self.out[rows],
                                     self.mask[rows], self.table[rows], self.context_lens[rows], lay.tables[rows],
                                     None, None)

    def attend(self, rows: slice = slice(None)) -> None:
        paged_decode_attention(self.layer.q[rows], self.k_cache, self.v_cache, self.table[rows],
                               self.context_lens[rows], D ** -0.5, out=self.attn[rows], num_kv_heads=HKV)

    def run(self, rows: slice = slice(None)) -> None:
        self.score(rows)
        self.select(rows)
        self.attend(rows)


def bench_halves(layer: Layer) -> None:
    """One Quest layer's score -> select -> attention: the whole batch on one stream, then two halves of the
    requests, the second half's chain on a side stream that waits for the first half's score."""
    b = layer.b
    quest = QuestChain(layer)
    score, select, attend, attn, chain = quest.score, quest.select, quest.attend, quest.attn, quest.run
    every = slice(0, b)
    first, second = slice(0, b // 2), slice(b // 2, b)
    side, scored = torch.cuda.Stream(), torch.cuda.Event()

    def halves() -> None:
        main = torch.cuda.current_stream()
        score(first)
        scored.record(main)
        side.wait_event(scored)
        select(first)
        attend(first)
        with torch.cuda.stream(side):
            score(second)
            select(second)
            attend(second)
        main.wait_stream(side)

    chain()
    whole = attn.clone()
    attn.zero_()
    halves()
    torch.cuda.synchronize()
    same = torch.equal(attn, whole)
    for label, fn in (("score", lambda: score(every)), ("select", lambda: select(every)),
                      ("attention", lambda: attend(every)), ("score -> select -> attention", chain),
                      (f"the same as two halves of {b // 2} on two streams", halves)):
        print(f"quest layer {label:44s}: {time_graph_us(fn):8.1f} us", flush=True)
    print(f"quest layer halves give the whole chain's bits: {same}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--parts", default="score,select,torch", help="comma-separated: score, select, torch, "
                        "halves")
    parser.add_argument("--only", default="", help="select lines whose label holds one of these comma-separated "
                        "substrings (\"S=8 paged sum,S=1 hot sum steered\"); default: every line")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    print(torch.cuda.get_device_name(0), torch.__version__, select_kernels.triton.__version__, flush=True)
    copy_gbps, _ = measure_copy_gbps()
    print(f"copy 1 GiB: {copy_gbps:.0f} GB/s (read + write)", flush=True)
    layer = Layer(args.batch, args.context, args.budget)
    if "score" in parts:
        bench_score(layer, copy_gbps)
    if "select" in parts:
        bench_select(layer, [o for o in args.only.split(",") if o])
    if "torch" in parts:
        bench_torch_path(layer)
    if "halves" in parts:
        bench_halves(layer)


if __name__ == "__main__":
    main()
