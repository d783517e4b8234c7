"""64-bit atomic loads, stores and fetch-add at raw addresses, for the doorbell and the
resident copier's host side.

With numba they are `@intrinsic`s emitting LLVM `load atomic acquire`, `store atomic release`,
`atomicrmw add seq_cst` and `fence acquire` / `release` / `seq_cst`, so a spin loop re-reads memory
on every iteration (a plain load could be hoisted out of the loop) and the payload reads cannot move before the
sequence-number read. Without numba: ctypes equivalents (CPython's GIL orders them; x86 is TSO).
"""

from __future__ import annotations

import ctypes
import threading

try:
    from llvmlite import ir
    from numba import types
    from numba.core.extending import intrinsic
except ImportError:  # pragma: no cover - exercised where numba is absent
    NATIVE = False
else:
    NATIVE = True

if NATIVE:

    def _ptr(builder, addr):
        return builder.inttoptr(addr, ir.IntType(64).as_pointer())

    @intrinsic
    def load_acquire(typingctx, addr):
        def codegen(context, builder, sig, args):
            return builder.load_atomic(_ptr(builder, args[0]), "acquire", 8)

        return types.int64(addr), codegen

    @intrinsic
    def store_release(typingctx, addr, value):
        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[1], sig.args[1], types.int64)
            builder.store_atomic(v, _ptr(builder, args[0]), "release", 8)
            return context.get_dummy_value()

        return types.void(addr, value), codegen

    @intrinsic
    def fetch_add(typingctx, addr, value):
        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[1], sig.args[1], types.int64)
            return builder.atomic_rmw("add", _ptr(builder, args[0]), v, "seq_cst")

        return types.int64(addr, value), codegen

    @intrinsic
    def fence_acquire(typingctx):
        def codegen(context, builder, sig, args):
            builder.fence("acquire")
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def fence_release(typingctx):
        def codegen(context, builder, sig, args):
            builder.fence("release")
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def fence_seq_cst(typingctx):
        """A full fence (mfence on x86): orders an earlier store before a later load, which
        acquire/release do not (store-buffer forwarding)."""

        def codegen(context, builder, sig, args):
            builder.fence("seq_cst")
            return context.get_dummy_value()

        return types.void(), codegen

else:  # pragma: no cover - exercised where numba is absent
    _lock = threading.Lock()

    def load_acquire(addr: int) -> int:
        return ctypes.c_int64.from_address(addr).value

    def store_release(addr: int, value: int) -> None:
        ctypes.c_int64.from_address(addr).value = value

    def fetch_add(addr: int, value: int) -> int:
        with _lock:
            cell = ctypes.c_int64.from_address(addr)
            old = cell.value
            cell.value = old + value
            return old

    def fence_acquire() -> None:
        pass

    def fence_release() -> None:
        pass

    def fence_seq_cst() -> None:
        pass
