"""PRIVATE: the only code in pulseio that imports cuda-python (`cuda.bindings`) or numba.

Nothing here is imported until a `CudaBackend` is opened, so machines without a GPU never load it.
"""
