"""Cases of the fused selection kernels against the torch reference, shared by the interpreter test (this
file run as a script, under TRITON_INTERPRET=1 in a child process: it prints one JSON line) and the GPU test.

Each case runs the Triton path (`use_triton=True`) on `device` and the reference (CPU) side by side and
returns {check: None if it held, else what differed}. The reference select is fed the Triton bounds, so
ids are compared exactly whatever the fp32 summation order; the bounds themselves are compared with
rtol 1e-5 (atol 1e-5 of the largest bound), or exactly when q and the digests are small integers (every
sum exact in any order, and ties frequent, so ties to the lower id are exercised)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pulseio_engine.config import GroupScore, SparseConfig  # noqa: E402
from pulseio_engine.kv.fused_selection import (  # noqa: E402
    Arrivals,
    HotRecall,
    NewToken,
    Steering,
    score_blocks,
    select_blocks_fused,
)

BS = 16


@dataclass(frozen=True)
class Spec:
    lens: tuple[int, ...]            # tokens per request, the one being decoded included
    nb: int                          # block-table columns
    budget: int                      # K
    hkv: int = 2
    group: int = 3
    d: int = 16
    head: int | None = None          # None: per-head Quest; else SoloHead with this KV head
    width: int | None = None         # digest columns W (default: Hkv for Quest, 1 for SoloHead)
    rule: GroupScore = GroupScore.SUM
    sink: int = 1
    local: int = 2
    dtype: str = "float32"
    integer: bool = False
    mode: str = "paged"              # paged | hot
    steps: int = 1                   # consecutive decode steps (tokens appended between them)
    steer: float | None = None       # overlap, or None: no steering
    new_token: bool = False          # HOT: the new token's K, V into its hot slot
    mask_extra: int = 5              # mask columns past NB (the kernel zeroes them)
    random_mask: bool = False        # start from a random mask (a previous selection, and ones past NB)
    zero_count: bool = True          # HOT: score_blocks zeroes count (False: it starts at 99, past the buffers)
    arrivals: bool = False           # HOT: the table split into resident blocks and arrivals
    hot: int | None = None           # HOT: hot entries a row, H >= K (None: K)
    rewarm: float = 0.0              # HOT with steer: the steered refill from the hot set
    ahead: float = 0.0               # HOT with steer: the refill from a random half of the hot set's blocks, as a
                                     # prediction recalled ahead would have brought them
    ages: int = 4                    # HOT: the hot entries' ages start below this (few values: ties)


def _config(spec: Spec) -> SparseConfig:
    return SparseConfig(token_budget=spec.budget * BS, block_size=BS, sink_blocks=spec.sink, local_blocks=spec.local,
                        group_score=spec.rule)


def _values(shape: tuple[int, ...], spec: Spec, gen: torch.Generator, low: int = -4) -> torch.Tensor:
    if spec.integer:
        return torch.randint(low, -low + 1, shape, generator=gen).float()
    return torch.randn(shape, generator=gen)


class _Side:
    """One path's (Triton or reference) persistent state of one layer and its output buffers."""

    def __init__(self, spec: Spec, state: dict[str, torch.Tensor], device: str, triton: bool) -> None:
        self.spec, self.triton, self.device = spec, triton, device
        self.t = {name: v.clone().to(device) for name, v in state.items()}
        b, s, k = state["mask"].shape[0], state["mask"].shape[1], spec.budget
        self.out = {"selected": torch.full((b, s, k), -7, dtype=torch.int64, device=device),
                    "table": torch.full((b, s, k), -7, dtype=torch.int32, device=device),
                    "context_lens": torch.full((b, s), -7, dtype=torch.int32, device=device)}
        if spec.arrivals:
            self.out["arrival_table"] = torch.full((b, s, k), -7, dtype=torch.int32, device=device)
            self.out["arrival_lens"] = torch.full((b, s), -7, dtype=torch.int32, device=device)

    def step(self, q: torch.Tensor, dmax: torch.Tensor, dmin: torch.Tensor, block_tables: torch.Tensor,
             num_tokens: torch.Tensor, bounds: torch.Tensor | None, kv: tuple[torch.Tensor, torch.Tensor]
             ) -> torch.Tensor:
        """One decode step; returns the bounds it computed (fed with the Triton bounds if given)."""
        spec, t, dev = self.spec, self.t, self.device
        args = [x.to(dev) for x in (q, dmax, dmin, block_tables)]
        hot = None
        if spec.mode == "hot":
            new = NewToken(kv[0].to(dev), kv[1].to(dev), t["pool"]) if spec.new_token else None
            cap = _capacity(self)              # B * S * K; the buffers run on: a guard that must stay untouched
            arrivals = Arrivals(self.out["arrival_table"], self.out["arrival_lens"]) if spec.arrivals else None
            hot = HotRecall(resident=t["resident"], owner=t["owner"], hot=t["hot"], age=t["age"],
                            host_map=t["host_map"], recall_ids=t["recall_ids"][:cap], recall_dst=t["recall_dst"][:cap],
                            count=t["count"], write_slot=t["write_slot"], new_token=new, arrivals=arrivals)
        own = score_blocks(*args, num_kv_heads=spec.hkv, head=spec.head, rule=spec.rule,
                           count=t["count"] if hot is not None and spec.zero_count else None,
                           use_triton=self.triton)
        steer = (Steering(spec.steer, t["calls"], seed=5, layer=3, rewarm=spec.rewarm, ahead=spec.ahead,
                          prefetched=t["prefetched"] if spec.ahead else None) if spec.steer is not None else None)
        select_blocks_fused(own if bounds is None else bounds.to(dev), num_tokens.to(dev), _config(spec),
                            mask=t["mask"], table=self.out["table"], context_lens=self.out["context_lens"],
                            block_tables=args[3] if hot is None else None, hot=hot, steer=steer,
                            out=self.out["selected"], use_triton=self.triton)
        return own


def run_case(spec: Spec, device: str, seed: int = 0) -> dict[str, dict]:
    """All checks of one case over its steps -> {"checks": {check: None or the first difference},
    "stats": what the steps exercised (blocks evicted and recalled after the first step, selected blocks
    that the previous step selected too), so a test can tell a vacuous case}."""
    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, spec.dtype)
    b, hq = len(spec.lens), spec.hkv * spec.group
    s = spec.hkv if spec.head is None else 1
    width = spec.width or (spec.hkv if spec.head is None else 1)
    n_phys, k = 3 * spec.nb, spec.budget
    nbw = spec.nb + spec.mask_extra
    mask = torch.randint(0, 2, (b, s, nbw), generator=gen) if spec.random_mask else torch.zeros((b, s, nbw))
    state = {"mask": mask.to(torch.uint8), "calls": torch.randint(0, 2**40, (b, s), generator=gen),
             "count": torch.full((1,), 99, dtype=torch.int64),     # a prediction's blocks: a stream of their own
             "prefetched": torch.randint(0, 2, (b, s, nbw), generator=torch.Generator().manual_seed(seed + 1))
             .to(torch.uint8)}
    if spec.mode == "hot":
        h = spec.hot or k
        n_slots = 2 + b * s * h
        hg, d = spec.hkv // s, spec.d
        state.update(**_warm_residency(b, s, spec.nb, h, gen),
                     hot=(2 + torch.randperm(b * s * h, generator=gen)).view(b, s, h),
                     age=torch.randint(0, spec.ages, (b, s, h), generator=gen, dtype=torch.int32),  # ties: lower index
                     host_map=torch.randint(1, 10_000, (b, s, spec.nb), generator=gen),
                     recall_ids=torch.full((3 * b * s * k,), -5, dtype=torch.int64),
                     recall_dst=torch.full((3 * b * s * k,), -5, dtype=torch.int64),
                     write_slot=torch.full((b, s), -5, dtype=torch.int64),
                     pool=torch.randn((n_slots, 2, BS, hg, d), generator=gen).to(dtype))
    kernel, ref = _Side(spec, state, device, True), _Side(spec, state, "cpu", False)
    lens = torch.tensor(spec.lens)
    failures: dict[str, str | None] = {}
    stats = {"evicted": 0, "recalled": 0, "reselected": 0, "kept_unselected": 0, "prefetched_hits": 0}
    for step in range(spec.steps):
        before = {name: ref.t[name].clone() for name in ("mask", "resident") if name in ref.t}
        q = _values((b, hq, spec.d), spec, gen, low=-3).to(dtype)
        lo, hi = _values((2, n_phys, width, spec.d), spec, gen)
        dmax, dmin = torch.maximum(lo, hi).to(dtype), torch.minimum(lo, hi).to(dtype)
        tables = torch.randint(0, n_phys, (b, spec.nb), generator=gen, dtype=torch.int32)
        kv = (torch.randn((b, spec.hkv, spec.d), generator=gen).to(dtype),
              torch.randn((b, spec.hkv, spec.d), generator=gen).to(dtype))
        got = kernel.step(q, dmax, dmin, tables, lens, None, kv)
        want = ref.step(q, dmax, dmin, tables, lens, got.cpu(), kv)
        _check_bounds(failures, step, got.cpu(), want, spec)
        _compare(failures, step, kernel, ref, spec)
        if step:
            stats["reselected"] += int((before["mask"].bool() & ref.t["mask"].bool()).sum())
            if spec.mode == "hot":
                stats["recalled"] += int(ref.t["count"])
                stats["evicted"] += int(((before["resident"] >= 0) & (ref.t["resident"] < 0)).sum())
                # selected blocks hot before the call, not selected the step before, that the prediction brought
                hit = ref.t["mask"][..., :spec.nb].bool() & ~before["mask"][..., :spec.nb].bool()
                stats["prefetched_hits"] += int((hit & (before["resident"] >= 0)
                                                 & ref.t["prefetched"][..., :spec.nb].bool()).sum())
                # blocks that stay hot without being selected: a hot set larger than the selection
                stats["kept_unselected"] += int(((ref.t["resident"] >= 0) & ~ref.t["mask"][..., :spec.nb].bool())
                                                .sum())
        lens = lens + torch.randint(1, BS, (b,), generator=gen)      # next step: blocks fill and new ones open
        lens = torch.minimum(lens, torch.tensor(spec.nb * BS))
    return {"checks": failures, "stats": stats}


def _capacity(side: _Side) -> int:
    """B * S * K: the recall buffers' entries the kernel may write."""
    b, s, _ = side.t["hot"].shape
    return b * s * side.spec.budget


def _warm_residency(b: int, s: int, nb: int, k: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A valid starting hot set per row: a random number of hot indices (some rows none, some all) hold
    random distinct blocks, so the first steps meet empty and evictable indices together."""
    resident = torch.full((b, s, nb), -1, dtype=torch.int64)
    owner = torch.full((b, s, k), -1, dtype=torch.int64)
    for i in range(b):
        for j in range(s):
            used = torch.randperm(k, generator=gen)[:int(torch.randint(0, k + 1, (1,), generator=gen))]
            blocks = torch.randperm(nb, generator=gen)[:len(used)]
            owner[i, j, used], resident[i, j, blocks] = blocks, used
    return {"resident": resident, "owner": owner}


def _check_bounds(failures: dict, step: int, got: torch.Tensor, want: torch.Tensor, spec: Spec) -> None:
    scale = float(want.abs().max())          # atol at the bounds' scale: a bound near 0 is a sum that cancelled
    ok = torch.equal(got, want) if spec.integer else torch.allclose(got, want, rtol=1e-5, atol=1e-5 * scale)
    _note(failures, "bounds", step, None if ok else f"max |diff| {(got - want).abs().max().item():.3g}")


def _compare(failures: dict, step: int, kernel: _Side, ref: _Side, spec: Spec) -> None:
    names = ["selected", "table", "context_lens"] + (["arrival_table", "arrival_lens"] if spec.arrivals else [])
    for name in names:
        got, want = kernel.out[name].cpu(), ref.out[name]
        _note(failures, name, step, None if torch.equal(got, want) else _first_diff(got, want))
    state = ["mask"] + (["calls"] if spec.steer is not None else [])
    if spec.mode == "hot":
        state += ["resident", "owner", "age", "write_slot", "count"] + (["pool"] if spec.new_token else [])
    for name in state:
        got, want = kernel.t[name].cpu(), ref.t[name]
        _note(failures, name, step, None if torch.equal(got, want) else _first_diff(got, want))
    if spec.mode == "hot":
        n = min(int(ref.t["count"]), _capacity(kernel))
        pairs = [sorted(zip(side.t["recall_ids"].cpu()[:n].tolist(), side.t["recall_dst"].cpu()[:n].tolist()))
                 for side in (kernel, ref)]
        _note(failures, "recall_pairs", step, None if pairs[0] == pairs[1] else f"{pairs[0][:6]} vs {pairs[1][:6]}")
        cap = _capacity(kernel)
        guard = all(bool((side.t[name][cap:] == -5).all()) for side in (kernel, ref)
                    for name in ("recall_ids", "recall_dst"))
        _note(failures, "recall_guard", step, None if guard else "a recall pair was written past the buffers")
        owner, resident = kernel.t["owner"].cpu(), kernel.t["resident"].cpu()
        inverse = all(resident[i, j, blk] == slot for i in range(owner.shape[0]) for j in range(owner.shape[1])
                      for slot, blk in enumerate(owner[i, j].tolist()) if blk >= 0)
        counted = int((owner >= 0).sum()) == int((resident >= 0).sum())
        _note(failures, "owner_is_inverse", step, None if inverse and counted else "owner is not resident's inverse")


def _first_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.shape != want.shape:
        return f"shape {list(got.shape)} vs {list(want.shape)}"
    where = (got != want).nonzero()[0].tolist()
    return f"at {where}: {got[tuple(where)].item()} vs {want[tuple(where)].item()} ({int((got != want).sum())} differ)"


def _note(failures: dict, name: str, step: int, problem: str | None) -> None:
    if failures.get(name) is None:
        failures[name] = None if problem is None else f"step {step}: {problem}"


# lengths: short (n <= K), exactly K blocks, just past K, long; sink and local overlap on the shortest
_LENS = (1, 40, 8 * BS, 8 * BS + 1, 37 * BS - 3)
CASES: dict[str, Spec] = {
    "quest-sum-integer-ties": Spec(_LENS, 40, 8, integer=True),
    "quest-maxnorm-integer-ties": Spec(_LENS, 40, 8, rule=GroupScore.MAX_NORM, integer=True),
    "quest-sum-random-fp16": Spec(_LENS, 40, 8, dtype="float16"),
    "quest-maxnorm-random": Spec(_LENS, 40, 8, rule=GroupScore.MAX_NORM, sink=0, local=1),
    "solohead-w1-sum-random": Spec(_LENS, 40, 8, head=1, d=32, sink=2, local=3),
    "solohead-wfull-maxnorm-integer": Spec(_LENS, 40, 8, head=1, width=2, rule=GroupScore.MAX_NORM, integer=True),
    "table-narrower-than-budget": Spec((1, 17, 50), 4, 8, integer=True),
    "bf16-integer": Spec(_LENS, 40, 8, dtype="bfloat16", integer=True, rule=GroupScore.MAX_NORM),
    "wide-block-8-warps": Spec((3000, 4100 * BS - 5), 4100, 64, hkv=1, group=2),
    "hot-quest-steps": Spec((5 * BS, 9 * BS + 3, 30 * BS), 48, 8, mode="hot", steps=6, new_token=True),
    "hot-solohead-integer-steps": Spec((2, 9 * BS, 30 * BS), 48, 8, head=0, mode="hot", steps=6, integer=True,
                                       new_token=True, rule=GroupScore.MAX_NORM),
    "steer-paged": Spec((3, 12 * BS, 30 * BS, 44 * BS), 48, 8, steps=8, steer=0.5),
    "steer-hot-integer": Spec((12 * BS, 40 * BS), 48, 8, mode="hot", steps=8, steer=0.7, integer=True),
    "steer-full-overlap": Spec((20 * BS, 40 * BS), 48, 8, steps=5, steer=1.0, head=1),
    "hot-quest-arrivals": Spec((5 * BS, 9 * BS + 3, 30 * BS), 48, 8, mode="hot", steps=6, new_token=True,
                               arrivals=True),
    "hot-solohead-arrivals-steer": Spec((2, 12 * BS + 7, 40 * BS), 48, 8, head=0, mode="hot", steps=6, steer=0.6,
                                        integer=True, arrivals=True, sink=2, local=1),
    "hot-count-not-zeroed": Spec((9 * BS, 30 * BS), 48, 8, mode="hot", steps=2, zero_count=False),
    "mask-wider-than-block": Spec((3, 20 * BS, 32 * BS), 32, 8, steps=3, steer=0.5, mask_extra=70, random_mask=True),
    "hot-lru-integer-steps": Spec((5 * BS, 9 * BS + 3, 30 * BS), 48, 8, mode="hot", steps=8, hot=13, integer=True,
                                  new_token=True),
    "hot-lru-steer-rewarm-arrivals": Spec((12 * BS, 40 * BS), 48, 8, mode="hot", steps=10, hot=16, steer=0.6,
                                          rewarm=0.7, integer=True, arrivals=True),
    "hot-lru-steer-rewarm-ahead-arrivals": Spec((12 * BS, 40 * BS), 48, 8, mode="hot", steps=10, hot=16, steer=0.6,
                                                rewarm=0.3, ahead=0.8, integer=True, arrivals=True),
    "hot-lru-solohead-ahead-only": Spec((2, 20 * BS, 44 * BS), 48, 8, head=1, mode="hot", steps=8, hot=20,
                                        steer=0.5, ahead=1.0, new_token=True),
    "hot-lru-solohead-rewarm-maxnorm": Spec((2, 20 * BS, 44 * BS), 48, 8, head=1, mode="hot", steps=8, hot=20,
                                            steer=0.5, rewarm=0.9, rule=GroupScore.MAX_NORM, new_token=True),
    "hot-set-wider-than-table": Spec((9 * BS, 30 * BS), 32, 8, mode="hot", steps=6, hot=40, steer=0.3, rewarm=1.0),
    # the eviction search starts at the oldest age's top digit: ages past fp32's 24 bits (2^24 + 5 rounds up), and
    # past 30 bits (the search from the top)
    "hot-lru-old-ages": Spec((9 * BS, 30 * BS), 48, 8, mode="hot", steps=4, hot=20, steer=0.5, ages=2**24 + 6),
    "hot-lru-ages-past-30-bits": Spec((9 * BS, 30 * BS), 48, 8, mode="hot", steps=3, hot=20, steer=0.5,
                                      ages=2**31 - 9),
    # wide rows steered over several steps (4,100 columns; a hot set over a 300-column table writing new tokens)
    "steer-wide": Spec((3000, 4100 * BS - 5), 4100, 64, hkv=1, group=2, steps=2, steer=0.5),
    "hot-lru-steer-wide-table": Spec((5 * BS, 9 * BS + 3, 290 * BS), 300, 8, d=64, mode="hot", steps=3, hot=13,
                                     steer=0.5, new_token=True),
    # tables just past a power of two (600 columns: a row of 512 and a tail of 256): blocks selected, recalled,
    # written and padded on both sides of column 512, the last block in the tail and out of it
    "tail-paged-integer": Spec((600 * BS - 3, 530 * BS, 513 * BS, 40 * BS, 1), 600, 64, integer=True),
    "tail-maxnorm-steer-wide-mask": Spec((600 * BS, 520 * BS, 300 * BS), 600, 32, rule=GroupScore.MAX_NORM, steps=3,
                                         steer=0.5, mask_extra=700, random_mask=True),
    "tail-hot-lru-steer-rewarm-ahead-arrivals": Spec((590 * BS + 3, 513 * BS + 2, 200 * BS), 600, 32, mode="hot",
                                                     steps=4, hot=48, steer=0.6, rewarm=0.3, ahead=0.8, integer=True,
                                                     arrivals=True, new_token=True),
    "tail-hot-solohead-maxnorm": Spec((600 * BS, 511 * BS + 9), 600, 40, head=1, mode="hot", steps=3,
                                      rule=GroupScore.MAX_NORM, new_token=True),
}


def gpu_specs() -> dict[str, Spec]:
    """The same cases in bf16 on a GPU, plus the shape the issue is about (qwen3-14b, 8 x 32K, K = 128)."""
    specs = {name: replace(spec, dtype="bfloat16") for name, spec in CASES.items()}
    big = Spec((32768,) * 4 + (30000, 20000, 2500, 1), 2048, 128, hkv=8, group=5, d=128, dtype="bfloat16")
    specs["qwen3-14b-quest-paged"] = big
    # 2050 columns (32K and 20 steps): a row of 2048 and a tail of 256
    past = replace(big, lens=(32800,) * 4 + (32780, 32769, 20000, 1), nb=2050)
    specs["qwen3-14b-quest-paged-steer-tail"] = replace(past, steps=3, steer=0.9)
    specs["qwen3-14b-solohead-lru-rewarm-ahead-tail"] = replace(past, head=3, mode="hot", steps=4, steer=0.8, hot=160,
                                                                rewarm=0.4, ahead=0.72, new_token=True, arrivals=True)
    specs["qwen3-14b-quest-hot-steer"] = replace(big, mode="hot", steps=3, steer=0.9, new_token=True)
    specs["qwen3-14b-solohead-maxnorm-hot"] = replace(big, head=3, rule=GroupScore.MAX_NORM, mode="hot", steps=3)
    specs["qwen3-14b-solohead-hot-steer-arrivals"] = replace(big, head=3, mode="hot", steps=3, steer=0.9,
                                                             new_token=True, arrivals=True)
    specs["qwen3-14b-solohead-lru-rewarm-arrivals"] = replace(big, head=3, mode="hot", steps=4, steer=0.8, hot=256,
                                                              rewarm=0.7, new_token=True, arrivals=True)
    specs["qwen3-14b-quest-lru-rewarm"] = replace(big, mode="hot", steps=4, steer=0.8, hot=192, rewarm=0.6)
    specs["qwen3-14b-solohead-lru-rewarm-ahead"] = replace(big, head=3, mode="hot", steps=4, steer=0.8, hot=256,
                                                           rewarm=0.4, ahead=0.72, new_token=True, arrivals=True)
    return specs


def main() -> None:
    results = {}
    for name, spec in CASES.items():
        try:
            results[name] = run_case(spec, "cpu")
        except Exception as exc:  # reported to the parent test, which fails with it
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
