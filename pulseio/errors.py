"""The exceptions pulseio raises. Every message states the rule, the value and, where there is one, the fix."""

from __future__ import annotations


class PulseError(Exception):
    """Base of every error pulseio raises on purpose."""


class ConfigError(PulseError, ValueError):
    """A configuration value breaks its rule (the message names the field, the value and the rule)."""


class WaitTimeout(PulseError, TimeoutError):
    """A wait ran out of time; what it waited for goes on (`Handle.wait`, `post_recall(timeout=)`)."""


class InvalidRequestError(PulseError, ValueError):
    """A transfer or pool request breaks a rule (ids out of range, duplicate slots, mismatched lengths...)."""


class PoolTooSmallError(InvalidRequestError):
    """A request needs more blocks, slots or staging room than the pool or machine has."""


class InsufficientMemoryError(PoolTooSmallError, MemoryError):
    """The machine (host RAM or GPU memory) has less room than a pool or buffer asks for; nothing was allocated."""


class CudaError(PulseError):
    """A CUDA driver call failed: `call` is the function, `code` the CUresult number, `name` its name."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} failed with {name} ({code})")
        self.call = call
        self.code = code
        self.name = name


class DeviceUnavailableError(PulseError, RuntimeError):
    """The CUDA backend was asked for but no usable GPU or CUDA package is present."""


class TransferError(PulseError):
    """A submitted transfer failed; the message names the transfer (tag, seq) and the cause."""


class ClosedError(PulseError):
    """The object was closed; nothing more can be submitted to it."""


class WouldBlock(PulseError):
    """An `X_nowait` call could not proceed without waiting."""


class PulseInternalError(PulseError):
    """An invariant broke: this is a bug in pulseio, please report it with the traceback."""
