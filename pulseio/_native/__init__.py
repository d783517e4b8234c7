"""PRIVATE: CPU code compiled with numba `njit(nogil=True)`: the doorbell reader/writer and its atomics.

Imports numba (never numba.cuda or cuda-python). Where numba is missing, the same functions run
as plain Python over ctypes loads and stores (correct, slower, and holding the GIL):
`ring.NATIVE` says which.
"""
