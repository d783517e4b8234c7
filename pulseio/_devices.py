"""open_backend: the one way to get a backend by name; nothing touches a GPU before it is called."""

from __future__ import annotations

from .backend import Backend
from .errors import ConfigError, DeviceUnavailableError
from .host_backend import HostBackend


def open_backend(device: str = "auto") -> Backend:
    """'cpu' -> HostBackend; 'cuda' or 'cuda:N' -> CudaBackend; 'auto' -> CUDA when torch sees a GPU."""
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return HostBackend()
    if device == "cuda" or device.startswith("cuda:"):
        try:
            from ._cuda.backend import CudaBackend
        except ImportError as exc:
            raise DeviceUnavailableError(
                f"the CUDA backend needs cuda-python and numba-cuda ({exc}); install pulseio[cuda]"
            ) from exc
        return CudaBackend(device)  # type: ignore[return-value]  # a structural match (see backend.py)
    raise ConfigError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
