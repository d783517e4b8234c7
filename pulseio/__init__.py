"""pulseio: move scattered KV-cache blocks between pinned host memory and the GPU at the link's limit."""

from ._devices import open_backend as open_backend
from ._poller import LatencySummary as LatencySummary
from .backend import Backend as Backend
from .config import AutoPolicy as AutoPolicy
from .config import DmaConfig as DmaConfig
from .config import RuntimeConfig as RuntimeConfig
from .dma import DmaEngine as DmaEngine
from .dma import DmaStatistics as DmaStatistics
from .doorbell import Doorbell as Doorbell
from .doorbell import DoorbellStatistics as DoorbellStatistics
from .doorbell import RingLayout as RingLayout
from .doorbell import Rung as Rung
from .errors import ClosedError as ClosedError
from .errors import ConfigError as ConfigError
from .errors import CudaError as CudaError
from .errors import DeviceUnavailableError as DeviceUnavailableError
from .errors import InsufficientMemoryError as InsufficientMemoryError
from .errors import InvalidRequestError as InvalidRequestError
from .errors import PoolTooSmallError as PoolTooSmallError
from .errors import PulseError as PulseError
from .errors import PulseInternalError as PulseInternalError
from .errors import TransferError as TransferError
from .errors import WaitTimeout as WaitTimeout
from .errors import WouldBlock as WouldBlock
from .gc_pauses import GCPauses as GCPauses
from .gc_pauses import GCPauseStatistics as GCPauseStatistics
from .gc_pauses import frozen_heap as frozen_heap
from .gil import gil_switch_interval as gil_switch_interval
from .handle import Handle as Handle
from .host_backend import HostBackend as HostBackend
from .interrupts import Completion as Completion
from .interrupts import InterruptPump as InterruptPump
from .interrupts import run_async as run_async
from .memory import DevicePool as DevicePool
from .memory import HostPool as HostPool
from .plan import Direction as Direction
from .plan import Strategy as Strategy
from .plan import TransferPlan as TransferPlan
from .recall_graph import RecallGraph as RecallGraph
from .runtime import Runtime as Runtime
from .runtime import RuntimeStatistics as RuntimeStatistics
from .runtime import open_runtime as open_runtime
from .transfer import Transfer as Transfer
from .transfer import TransferState as TransferState

__version__ = "0.1.0"
