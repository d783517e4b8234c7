"""Checked CUDA driver calls through cuda-python (`cuda.bindings.driver`).

Every call goes through `check`, which turns a failing CUresult into a `CudaError` naming the call.
`cuMemcpyBatchAsync` is called through the function pointer `cuGetProcAddress` returns, with
ctypes arrays built by numpy: the cuda-python wrapper wants one `CUdeviceptr` object per copy,
which would be a Python loop per block on the hot path.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np
import torch
from cuda.bindings import driver as cu

from ..errors import CudaError

_MEMCPY_SRC_ACCESS_ORDER_STREAM = int(cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM)
_MEM_LOCATION_TYPE_HOST = int(cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST)
_MEM_LOCATION_TYPE_DEVICE = int(cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE)
_HOST_REGISTER_FLAGS = int(cu.CU_MEMHOSTREGISTER_PORTABLE) | int(cu.CU_MEMHOSTREGISTER_DEVICEMAP)


def check(call: str, result: tuple[Any, ...] | Any) -> Any:
    """Unpack a cuda-python result tuple, raising `CudaError` if its CUresult is not CUDA_SUCCESS."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if status != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(status)
        raise CudaError(call, int(status), name.decode() if isinstance(name, bytes) else str(name))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def init() -> None:
    check("cuInit", cu.cuInit(0))


def primary_context(ordinal: int) -> Any:
    """The device's primary context (the one torch and numba use), retained once by the caller."""
    device = check("cuDeviceGet", cu.cuDeviceGet(ordinal))
    return check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(device))


def set_current(context: Any) -> None:
    """Driver calls act on the calling thread's current context; pulseio's own threads have none."""
    check("cuCtxSetCurrent", cu.cuCtxSetCurrent(context))


def is_capturing(stream_handle: int) -> bool:
    """Whether the stream is capturing a CUDA graph."""
    status = check("cuStreamIsCapturing", cu.cuStreamIsCapturing(cu.CUstream(stream_handle)))
    return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def relax_stream_capture() -> None:
    """Put the calling thread in relaxed stream-capture mode: while another thread captures a CUDA graph
    in the default (global) mode, calls such as an event query from this thread stay legal."""
    check("cuThreadExchangeStreamCaptureMode",
          cu.cuThreadExchangeStreamCaptureMode(cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))


class OwnStream:
    """A non-blocking CUDA stream of pulseio's own, at the device's highest priority, outside torch's stream pool.

    torch hands out the 32 streams of each priority's pool round-robin, so a pool stream is also what every 32nd
    later request of that priority gets: another component's work there would queue behind a long-running copy
    kernel, and a graph captured there would capture (or refuse) pulseio's launches. `torch` wraps the handle for
    torch's stream APIs; `destroy` releases it once its work is done (CUDA lets queued work finish)."""

    def __init__(self, device: torch.device) -> None:
        _, greatest = check("cuCtxGetStreamPriorityRange", cu.cuCtxGetStreamPriorityRange())
        stream = check("cuStreamCreateWithPriority",
                       cu.cuStreamCreateWithPriority(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), greatest))
        self.handle = int(stream)
        self.torch = torch.cuda.ExternalStream(self.handle, device=device)

    def destroy(self) -> None:
        if self.handle:
            check("cuStreamDestroy", cu.cuStreamDestroy(cu.CUstream(self.handle)))
            self.handle = 0


def host_register(ptr: int, nbytes: int) -> int:
    """Pin and device-map `nbytes` at `ptr`; returns the device pointer (equal to `ptr` under UVA)."""
    check("cuMemHostRegister", cu.cuMemHostRegister(ptr, nbytes, _HOST_REGISTER_FLAGS))
    return int(check("cuMemHostGetDevicePointer", cu.cuMemHostGetDevicePointer(ptr, 0)))


def host_unregister(ptr: int) -> None:
    check("cuMemHostUnregister", cu.cuMemHostUnregister(ptr))


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):
    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", _MemLocation),
        ("dstLocHint", _MemLocation),
        ("flags", ctypes.c_uint),
    ]


_BatchFn = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,  # CUdeviceptr *dsts
    ctypes.c_void_p,  # CUdeviceptr *srcs
    ctypes.c_void_p,  # size_t *sizes
    ctypes.c_size_t,  # count
    ctypes.POINTER(_MemcpyAttributes),
    ctypes.c_void_p,  # size_t *attrsIdxs
    ctypes.c_size_t,  # numAttrs
    ctypes.c_void_p,  # CUstream
)


def proc_address(name: str, version: int = 13000) -> int:
    """The driver's entry point for `name`, to call through ctypes."""
    pfn = check("cuGetProcAddress", cu.cuGetProcAddress(name.encode(), version, 0))
    pfn = pfn[0] if isinstance(pfn, tuple) else pfn
    if not int(pfn):
        raise CudaError(f"cuGetProcAddress({name})", 0, "CUDA_ERROR_NOT_FOUND")
    return int(pfn)


def kernel_function(kernel: Any) -> int:
    """The CUfunction of a library kernel (CUkernel) in the current context, as an address."""
    return int(check("cuKernelGetFunction", cu.cuKernelGetFunction(kernel)))


class MemcpyBatch:
    """`cuMemcpyBatchAsync` (CUDA 13 ABI) with stream-ordered source access, one attribute set for all."""

    def __init__(self, *, host_to_device: bool, device_ordinal: int) -> None:
        self._fn = _BatchFn(proc_address("cuMemcpyBatchAsync"))
        host = _MemLocation(_MEM_LOCATION_TYPE_HOST, 0)
        device = _MemLocation(_MEM_LOCATION_TYPE_DEVICE, device_ordinal)
        src, dst = (host, device) if host_to_device else (device, host)
        self._attrs = _MemcpyAttributes(_MEMCPY_SRC_ACCESS_ORDER_STREAM, src, dst, 0)
        self._attr_idx = np.zeros(1, dtype=np.uint64)

    def __call__(self, dsts: np.ndarray, srcs: np.ndarray, sizes: np.ndarray, stream_handle: int) -> None:
        """dsts, srcs, sizes: [n] uint64 (addresses and byte counts); enqueued on `stream_handle`."""
        count = len(sizes)
        status = self._fn(
            dsts.ctypes.data,
            srcs.ctypes.data,
            sizes.ctypes.data,
            count,
            ctypes.byref(self._attrs),
            self._attr_idx.ctypes.data,
            1,
            stream_handle,
        )
        if status != 0:
            check("cuMemcpyBatchAsync", (cu.CUresult(status),))


_WRITE_DEFAULT = int(cu.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT)
_StreamValueFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint)


@functools.cache
def _stream_value_op(name: str) -> Any:
    return _StreamValueFn(proc_address(name))


def write_value(stream_handle: int, address: int, value: int) -> None:
    """Enqueue on the stream: store value at `address` once earlier work on it is done (memory barrier)."""
    status = _stream_value_op("cuStreamWriteValue64")(stream_handle, address, value, _WRITE_DEFAULT)
    if status:
        check("cuStreamWriteValue64", (cu.CUresult(status),))
