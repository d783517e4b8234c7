"""The engine's error types. Each message states the value found, the rule, and the fix."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class UnsupportedModelError(EngineError, ValueError):
    """A checkpoint or preset the engine cannot run (architecture, option or tensor it does not know)."""


class PromptTooLongError(EngineError, ValueError):
    """A request needs more positions than the model's context limit allows."""


class KVBudgetError(EngineError, ValueError):
    """A request needs more KV blocks than the whole cache holds: it could never be admitted."""


class OffloadCapacityError(EngineError, ValueError):
    """An offload request needs more host-pool units or hot slots than are free, or the engine has no
    offload configured."""
