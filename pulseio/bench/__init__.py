"""`pulseio bench`: the PCIe / block-transfer benchmark people run on their own machines."""

from .records import BenchRecord as BenchRecord
from .suite import BenchOptions as BenchOptions
from .suite import run_bench as run_bench
