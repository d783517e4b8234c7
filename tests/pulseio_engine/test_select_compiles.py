"""The select kernel compiles for sm_90 in its variants, on a machine without a GPU (Triton compiles offline).

The interpreter runs a kernel's Python as Python, so it accepts code the compiler rejects (a variable that one
branch of a dynamic `if` redefines with another type, say). Each variant here is the set of constexpr flags some
launch of `launch_select` passes."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.needs_package("triton")

_POINTERS = dict(
    bounds_ptr="*fp32", ntok_ptr="*i64", sel_ptr="*i64", mask_ptr="*u8", table_ptr="*i32", ctx_ptr="*i32",
    bt_ptr="*i32", res_ptr="*i64", owner_ptr="*i64", hot_ptr="*i64", age_ptr="*i32", hmap_ptr="*i64",
    ids_ptr="*i64", dst_ptr="*i64", count_ptr="*i64", scratch_ptr="*i32", wslot_ptr="*i64", k_ptr="*bf16",
    v_ptr="*bf16", pool_ptr="*bf16", calls_ptr="*i64", atab_ptr="*i32", actx_ptr="*i32", pref_ptr="*u8",
)
_BASE = dict(K=128, KB=128, SINK=1, LOCAL=2, BLOCK_SIZE=16, BLOCK=4096, GROUP=1, MAX_NORM=False, HOT=False,
             STEER=False, REWARM=False, AHEAD=False, WRITE_KV=False, SPLIT=False, HG=8, HG_PAD=8, HEAD_DIM=128,
             MASK_TILES=1, PER_THREAD=16, H=128, HB=128, PER_THREAD_H=1, SALT=12345, TAIL=1, HAS_TAIL=False,
             PER_THREAD_T=1)
_TAIL = dict(BLOCK=2048, PER_THREAD=8, TAIL=256, HAS_TAIL=True, PER_THREAD_T=1)   # 2050 columns: 2048 + 256
_VARIANTS = {
    "paged": {},
    "paged-max-norm": dict(MAX_NORM=True, GROUP=5),
    "paged-steered": dict(STEER=True),
    "hot-steered-new-token": dict(HOT=True, STEER=True, WRITE_KV=True),
    "hot-rewarm-ahead-arrivals": dict(HOT=True, STEER=True, REWARM=True, AHEAD=True, SPLIT=True, WRITE_KV=True,
                                      H=256, HB=256, PER_THREAD_H=1),
    "hot-mask-wider-than-block": dict(HOT=True, SPLIT=True, MASK_TILES=2),
    "paged-steered-tail": dict(STEER=True, **_TAIL),
    "paged-max-norm-tail": dict(MAX_NORM=True, GROUP=5, **_TAIL),
    "hot-rewarm-ahead-arrivals-tail": dict(HOT=True, STEER=True, REWARM=True, AHEAD=True, SPLIT=True, WRITE_KV=True,
                                           H=256, HB=256, PER_THREAD_H=1, MASK_TILES=2, **_TAIL),
    "hot-steered-new-token-tail": dict(HOT=True, STEER=True, WRITE_KV=True, **_TAIL),
}


@pytest.mark.parametrize("variant", list(_VARIANTS))
def test_select_kernel_compiles_for_sm90(variant: str) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pulseio_engine.kv.select_kernels import _select_kernel

    fn = _select_kernel
    const = dict(_BASE, **_VARIANTS[variant])
    names = fn.arg_names
    signature = {n: "constexpr" if n in const else _POINTERS.get(n, "fp32" if n in ("rewarm", "ahead") else
                                                                  "i64" if n == "keep_threshold" else "i32")
                 for n in names}
    constexprs = {(names.index(n),): v for n, v in const.items()}
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    assert "_select_kernel" in kernel.asm["ptx"] and len(kernel.asm["cubin"]) > 0


@pytest.mark.parametrize("k", [8, 128, 1024])
def test_row_split_covers_the_table_in_a_power_of_two_and_a_tail(k: int) -> None:
    import triton

    from pulseio_engine.kv.select_kernels import _row_split

    for nb in (1, 37, 255, 256, 257, 600, 2047, 2048, 2049, 2050, 2304, 2305, 3072, 3073, 4097, 8200, 20000):
        block, tail, warps = _row_split(nb, k)
        threads = 32 * warps
        assert block == triton.next_power_of_2(block) and block >= k, (nb, k, block)
        assert block + tail >= nb, (nb, k, block, tail)
        if tail:  # the smallest power of two of at least a column a thread past the row, at most half of it
            assert block < nb and tail == max(threads, triton.next_power_of_2(nb - block)), (nb, k, block, tail)
            assert tail <= block // 2, (nb, k, block, tail)
        else:
            assert block == triton.next_power_of_2(max(nb, k)), (nb, k, block)
    assert _row_split(2050, 128) == (2048, 256, 8)   # the step's table after 32K tokens and 20 steps
    assert _row_split(3073, 128) == (4096, 0, 8)     # a tail past half the row: the next power of two
