"""Serving traces: Mooncake request records and ServeGen distributions, read, drawn and transformed (no torch)."""

from .load import SAMPLES as SAMPLES
from .load import TraceFormat as TraceFormat
from .load import TraceOptions as TraceOptions
from .load import open_trace as open_trace
from .load import sample_path as sample_path
from .mooncake import read_mooncake as read_mooncake
from .records import Trace as Trace
from .records import TraceError as TraceError
from .records import TraceRequest as TraceRequest
from .servegen import client_pairs as client_pairs
from .servegen import draw_requests as draw_requests
from .servegen import read_client as read_client
from .transform import clip_lengths as clip_lengths
from .transform import scale_time as scale_time
from .transform import take_window as take_window
