"""Llama / Qwen3 models: weights, loading, and the per-layer forward."""

from .batch_state import BatchState as BatchState
from .checkpoint import Checkpoint as Checkpoint
from .checkpoint import load_checkpoint as load_checkpoint
from .llama import CausalLM as CausalLM
from .params import ModelWeights as ModelWeights
from .presets import PRESETS as PRESETS
