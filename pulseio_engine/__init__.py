"""PulseIO decode engine: Llama/Qwen2/Qwen3 models over a paged KV cache with continuous batching.

The public API, in one place. See `pulseio_engine.cli` for the `pulseio-engine` command.
"""

from .config import Architecture as Architecture
from .config import CacheConfig as CacheConfig
from .config import DType as DType
from .config import EngineConfig as EngineConfig
from .config import GroupScore as GroupScore
from .config import ModelConfig as ModelConfig
from .config import OffloadConfig as OffloadConfig
from .config import RecallMode as RecallMode
from .config import RopeScaling as RopeScaling
from .config import SchedulerConfig as SchedulerConfig
from .config import SparseConfig as SparseConfig
from .config import SparseMode as SparseMode
from .engine import Engine as Engine
from .engine import EngineStatistics as EngineStatistics
from .errors import EngineError as EngineError
from .errors import KVBudgetError as KVBudgetError
from .errors import OffloadCapacityError as OffloadCapacityError
from .errors import PromptTooLongError as PromptTooLongError
from .errors import UnsupportedModelError as UnsupportedModelError
from .fetch import fetch_model as fetch_model
from .fetch import fetch_smollm2 as fetch_smollm2
from .kv.handoff import KVHandoff as KVHandoff
from .kv.handoff import RandomKV as RandomKV
from .kv.offload_layout import OffloadFootprint as OffloadFootprint
from .kv.offload_layout import offload_footprint as offload_footprint
from .kv.retrieval_heads import RetrievalHeads as RetrievalHeads
from .model.checkpoint import load_checkpoint as load_checkpoint
from .offload import OffloadStatistics as OffloadStatistics
from .request import FinishReason as FinishReason
from .request import RequestOutput as RequestOutput
from .request import SamplingParams as SamplingParams
from .serving import ReplayOptions as ReplayOptions
from .serving import ServeMode as ServeMode
from .serving import ServingConfig as ServingConfig
from .serving import ServingEngine as ServingEngine
from .serving import replay as replay
from .trace import Trace as Trace
from .trace import TraceError as TraceError
from .trace import TraceOptions as TraceOptions
from .trace import open_trace as open_trace
