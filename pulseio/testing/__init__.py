"""Test helpers shipped with pulseio: drive the doorbell by hand, reorder completions."""

from .manual import DelayedBackend as DelayedBackend
from .manual import ManualDoorbell as ManualDoorbell
