"""Run under TRITON_INTERPRET=1 by test_select_top.py: `select_kernels._top`, the select kernel's threshold search,
on rows built to start it at every depth (one sign, a narrow range, all keys equal, keys at the int32 ends) and
with every kind of need (0, the members' count, more than it, none a member), each as one row and as a row and
its tail. Prints one JSON line: per case, the
rows where the kernel and the definition differ."""

from __future__ import annotations

import json

import torch
import triton
import triton.language as tl

from pulseio_engine.kv.select_kernels import _top

BLOCK = 256
WARPS = 2
SPLIT = (128, 64)   # the first 192 columns of a row as a row of 128 and a tail of 64 (one column a thread)


@triton.jit
def _top_kernel(key_ptr, member_ptr, need_ptr, out_ptr, STRIDE: tl.constexpr, BLOCK: tl.constexpr,
                TAIL: tl.constexpr, HAS_TAIL: tl.constexpr, PER_THREAD: tl.constexpr, PER_THREAD_T: tl.constexpr):
    row = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    i_t = BLOCK + tl.arange(0, TAIL)
    key = tl.load(key_ptr + row * STRIDE + i)
    member = tl.load(member_ptr + row * STRIDE + i) != 0
    in_row = (i_t < STRIDE) & HAS_TAIL      # without a tail, i_t is the next row's first column: not read
    key_t = tl.load(key_ptr + row * STRIDE + i_t, mask=in_row, other=0)
    member_t = tl.load(member_ptr + row * STRIDE + i_t, mask=in_row, other=0) != 0
    top, top_t = _top(key, member, key_t, member_t, tl.load(need_ptr + row), PER_THREAD, PER_THREAD_T, HAS_TAIL)
    tl.store(out_ptr + row * STRIDE + i, top.to(tl.int8))
    if HAS_TAIL:
        tl.store(out_ptr + row * STRIDE + i_t, top_t.to(tl.int8))


def definition(key: torch.Tensor, member: torch.Tensor, need: int) -> torch.Tensor:
    """The need members of largest key, ties to the lower index (all of them when fewer)."""
    ids = [i for i in range(key.numel()) if member[i]]
    ids.sort(key=lambda i: (-int(key[i]), i))
    out = torch.zeros(key.numel(), dtype=torch.int8)
    out[ids[:need]] = 1
    return out


def rows(gen: torch.Generator) -> dict[str, list[tuple[torch.Tensor, torch.Tensor, int]]]:
    def order_key(x: torch.Tensor) -> torch.Tensor:  # as select_kernels._order_key
        bits = torch.where(x == 0, torch.zeros_like(x), x).view(torch.int32)
        return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)

    def members(p: float) -> torch.Tensor:
        return torch.rand(BLOCK, generator=gen) < p

    cases: dict[str, list] = {
        "mixed-sign": [(order_key(torch.randn(BLOCK, generator=gen)), members(0.9), 37)],
        "positive": [(order_key(torch.rand(BLOCK, generator=gen) * 50 + 1), members(0.8), 20)],
        "negative-max-norm": [(order_key(-torch.rand(BLOCK, generator=gen) * 3), members(1.0), 64)],
        "narrow-range": [(order_key(1.0 + torch.randint(0, 7, (BLOCK,), generator=gen) * 2.0**-20), members(0.7), 30)],
        "all-equal": [(torch.full((BLOCK,), 12345, dtype=torch.int32), members(0.6), 9)],
        "small-ages": [(torch.randint(0, 5, (BLOCK,), generator=gen, dtype=torch.int32), members(0.5), 11)],
        "int32-ends": [(torch.tensor([2**31 - 1, -2**31 + 1] * (BLOCK // 2), dtype=torch.int32), members(0.9), 50)],
        "one-member": [(order_key(torch.randn(BLOCK, generator=gen)), torch.arange(BLOCK) == 77, 1)],
    }
    key, member = order_key(torch.rand(BLOCK, generator=gen) + 2), members(0.5)
    count = int(member.sum())
    cases["need-0"] = [(key, member, 0)]
    cases["need-all"] = [(key, member, count)]
    cases["need-more-than-members"] = [(key, member, count + 5)]
    cases["no-members"] = [(key, torch.zeros(BLOCK, dtype=torch.bool), 3)]
    return cases


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    results = {}
    threads = 32 * WARPS
    for name, cases in rows(gen).items():
        keys = torch.stack([c[0] for c in cases]).contiguous()
        mem = torch.stack([c[1] for c in cases]).to(torch.int8).contiguous()
        needs = torch.tensor([c[2] for c in cases], dtype=torch.int32)
        for (block, tail), label in (((BLOCK, 1), name), (SPLIT, f"{name} (tail)")):
            cols = block + (tail if tail > 1 else 0)
            out = torch.zeros_like(mem)
            _top_kernel[(len(cases),)](keys, mem, needs, out, STRIDE=BLOCK, BLOCK=block, TAIL=tail, HAS_TAIL=tail > 1,
                                       PER_THREAD=block // threads, PER_THREAD_T=max(1, tail // threads),
                                       num_warps=WARPS)
            want = torch.stack([definition(c[0][:cols], c[1][:cols], c[2]) for c in cases])
            results[label] = [r for r in range(len(cases)) if not torch.equal(out[r, :cols], want[r])]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
