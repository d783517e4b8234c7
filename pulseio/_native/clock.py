"""`monotonic_ns()`, callable from compiled (numba) code: the clock `time.perf_counter_ns()` reads.

The doorbell's fast lane stamps the moment it sees a request inside its GIL-free spin, before any
Python runs; a stamp taken after returning to Python would add the return and the GIL to what is
reported as publish -> seen. On Linux, perf_counter_ns is clock_gettime(CLOCK_MONOTONIC); compiled
code calls libc's clock_gettime directly (an intrinsic, so the caller stays cacheable, which a
ctypes function pointer would prevent). Elsewhere the stamp is 0 and the reader stamps with
perf_counter_ns when it returns.
"""

from __future__ import annotations

import sys
import time

from .atomics import NATIVE

_LINUX = sys.platform.startswith("linux")
_CLOCK_MONOTONIC = 1  # <time.h> on Linux

if NATIVE and _LINUX:
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.core.extending import intrinsic

    @intrinsic
    def _clock_monotonic_ns(typingctx):
        def codegen(context, builder, sig, args):
            i64 = ir.IntType(64)
            fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32), i64.as_pointer()])
            clock_gettime = cgutils.get_or_insert_function(builder.module, fnty, "clock_gettime")
            ts = cgutils.alloca_once(builder, i64, size=2)  # struct timespec {tv_sec, tv_nsec}
            builder.call(clock_gettime, [ir.Constant(ir.IntType(32), _CLOCK_MONOTONIC), ts])
            sec = builder.load(ts)
            nsec = builder.load(builder.gep(ts, [ir.Constant(ir.IntType(32), 1)]))
            return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)

        return types.int64(), codegen

    @njit(nogil=True, cache=True)
    def monotonic_ns():
        return _clock_monotonic_ns()

elif NATIVE:  # pragma: no cover - not Linux: compiled callers get 0 and the reader stamps instead
    from numba import njit

    @njit(nogil=True, cache=True)
    def monotonic_ns():
        return 0

else:  # pragma: no cover - exercised where numba is absent

    def monotonic_ns() -> int:
        return time.perf_counter_ns() if _LINUX else 0
