"""Serving: the decode instance that replays traces, a normal and an offload batch interleaved layer by layer.

    report = replay(open_trace(TraceOptions("mooncake-sample", max_requests=50, max_input=3072, max_output=64)),
                    open_model("tiny"), ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=20 << 20,
                                                      host_kv_bytes=512 << 20, offload_threshold=2048,
                                                      token_budget=256), ReplayOptions())
"""

from .budget import KVClass as KVClass
from .config import ServeMode as ServeMode
from .config import ServingConfig as ServingConfig
from .engine import ServingEngine as ServingEngine
from .replay import ReplayOptions as ReplayOptions
from .replay import replay as replay
from .report import check_report as check_report
from .report import load_report as load_report
