"""Device-code loads, stores and atomics at raw addresses, with an explicit PTX scope and order;
and the GPU clock.

The resident copy kernel talks to the host through pinned memory and to its own CTAs through a
few device words. Both need what numba's array accesses do not say: a load that really goes to
memory on every spin (a plain load may be hoisted or served from L1), acquire/release order, and
the scope it holds at: `.sys` for words the CPU writes or reads, `.gpu` for words only CTAs share.
On the GPU these are one PTX instruction each (inline asm); under NUMBA_ENABLE_CUDASIM, where
"device" memory is host memory, they are ctypes accesses (atomics under one lock).
"""

from __future__ import annotations

import ctypes
import threading
import time

from numba import config as numba_config
from numba import cuda, types

from . import _numba_compat  # noqa: F401  (must precede numba.cuda)

if numba_config.ENABLE_CUDASIM:  # pragma: no cover - the simulator runs device code as Python
    _atomic_lock = threading.Lock()

    def _cell(addr):
        return ctypes.c_int64.from_address(int(addr))

    def load_acquire_sys(addr):
        return _cell(addr).value

    load_relaxed_sys = load_acquire_sys

    def store_release_sys(addr, value):
        _cell(addr).value = int(value)

    store_relaxed_sys = store_release_sys

    load_acquire_gpu, load_relaxed_gpu, store_release_gpu = load_acquire_sys, load_acquire_sys, store_release_sys

    def atomic_add_gpu(addr, value):
        with _atomic_lock:
            old = _cell(addr).value
            _cell(addr).value = old + int(value)
            return old

    def reduce_max_release_gpu(addr, value):
        with _atomic_lock:
            _cell(addr).value = max(_cell(addr).value, int(value))

    def pause():
        pass

    def globaltimer():
        return time.time_ns()

else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    _I64 = ir.IntType(64)

    def _asm(ret, args, text, constraints):
        return ir.InlineAsm(ir.FunctionType(ret, args), text, constraints, side_effect=True)

    def _load(text):
        @intrinsic
        def load(typingctx, addr):
            def codegen(context, builder, sig, args):
                return builder.call(_asm(_I64, [_I64], text, "=l,l,~{memory}"), [args[0]])

            return types.int64(types.int64), codegen

        return load

    def _store(text):
        @intrinsic
        def store(typingctx, addr, value):
            def codegen(context, builder, sig, args):
                builder.call(_asm(ir.VoidType(), [_I64, _I64], text, "l,l,~{memory}"), list(args))
                return context.get_dummy_value()

            return types.void(types.int64, types.int64), codegen

        return store

    def _atomic(text):
        @intrinsic
        def rmw(typingctx, addr, value):
            def codegen(context, builder, sig, args):
                return builder.call(_asm(_I64, [_I64, _I64], text, "=l,l,l,~{memory}"), list(args))

            return types.int64(types.int64, types.int64), codegen

        return rmw

    _load_acquire_sys = _load("ld.acquire.sys.b64 $0, [$1];")
    _load_relaxed_sys = _load("ld.relaxed.sys.b64 $0, [$1];")
    _load_acquire_gpu = _load("ld.acquire.gpu.b64 $0, [$1];")
    _load_relaxed_gpu = _load("ld.relaxed.gpu.b64 $0, [$1];")
    _store_release_sys = _store("st.release.sys.b64 [$0], $1;")
    _store_relaxed_sys = _store("st.relaxed.sys.b64 [$0], $1;")
    _store_release_gpu = _store("st.release.gpu.b64 [$0], $1;")
    _reduce_max_release_gpu = _store("red.release.gpu.global.max.s64 [$0], $1;")
    _atomic_add_gpu = _atomic("atom.acq_rel.gpu.add.u64 $0, [$1], $2;")

    @cuda.jit(device=True, inline=True)
    def load_acquire_sys(addr):
        """The int64 at addr, read from memory (host-mapped or device), acquire at system scope."""
        return _load_acquire_sys(addr)

    @cuda.jit(device=True, inline=True)
    def load_relaxed_sys(addr):
        """The int64 at addr, read from memory, no ordering (independent loads overlap)."""
        return _load_relaxed_sys(addr)

    @cuda.jit(device=True, inline=True)
    def load_acquire_gpu(addr):
        """The int64 at a device-memory addr, acquire at GPU scope (CTAs of this GPU)."""
        return _load_acquire_gpu(addr)

    @cuda.jit(device=True, inline=True)
    def load_relaxed_gpu(addr):
        """The int64 at a device-memory addr, read from L2 (not L1), no ordering: independent loads overlap."""
        return _load_relaxed_gpu(addr)

    @cuda.jit(device=True, inline=True)
    def store_release_sys(addr, value):
        _store_release_sys(addr, value)

    @cuda.jit(device=True, inline=True)
    def store_relaxed_sys(addr, value):
        """Store at system scope, no ordering (a stamp nothing waits on)."""
        _store_relaxed_sys(addr, value)

    @cuda.jit(device=True, inline=True)
    def store_release_gpu(addr, value):
        _store_release_gpu(addr, value)

    @cuda.jit(device=True, inline=True)
    def atomic_add_gpu(addr, value):
        """Add value to the int64 at a device-memory addr; returns the old value."""
        return _atomic_add_gpu(addr, value)

    @cuda.jit(device=True, inline=True)
    def reduce_max_release_gpu(addr, value):
        """Raise the int64 at a device-memory addr to at least value, after this thread's earlier accesses;
        no old value comes back, so the thread does not wait for the L2 round trip."""
        _reduce_max_release_gpu(addr, value)

    @cuda.jit(device=True, inline=True)
    def pause():
        """Back off a spinning thread (~0.1 us) so it does not hammer L2 or the link."""
        cuda.nanosleep(100)

    @intrinsic
    def _globaltimer(typingctx):
        def codegen(context, builder, sig, args):
            return builder.call(_asm(_I64, [], "mov.u64 $0, %globaltimer;", "=l"), [])

        return types.int64(), codegen

    @cuda.jit(device=True)
    def globaltimer():
        """The GPU's nanosecond %globaltimer (resolution about 1 us on recent GPUs)."""
        return _globaltimer()
