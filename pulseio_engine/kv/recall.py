"""Carry out one layer's recall plan through a `pulseio.Runtime`: a handful of calls, no per-block loop.

The plan's rows are padded; `compact` packs the needed (host unit, device slot) pairs first, in
fixed-size tensors, and counts them on the device. Then:

- DOORBELL: `post_recall(host_ids=ids, device_slots=slots, count=count)` publishes ids and count as they lie (decided on
  the device: no host sync), and `device_wait()` orders the layer's attention after the copy.
- SYNC (the ArkVale-like baseline): the count and ids come to the host (a device sync), the host
  calls `recall(host_ids=, device_slots=)` and waits for it before the layer goes on.
"""

from __future__ import annotations

from typing import Any

import torch

import pulseio

from ..config import RecallMode
from ..errors import EngineError


class RecallError(EngineError, RuntimeError):
    """A recall did not land (pulseio reported it failed, or it timed out)."""


def compact(host_units: torch.Tensor, slots: torch.Tensor, need: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """host_units, slots: [R, K] int64; need: [R, K] bool -> (ids [R*K], dst [R*K], count [1]) int64
    with the needed pairs first, in row order."""
    order = torch.argsort((~need).reshape(-1).long(), stable=True)       # [R*K]
    return (host_units.reshape(-1)[order].contiguous(), slots.reshape(-1)[order].contiguous(),
            need.sum().reshape(1))


class Recaller:
    def __init__(self, runtime: Any, mode: RecallMode, *, timeout_s: float = 30.0) -> None:
        """runtime: an open `pulseio.Runtime` whose pools hold the host units and hot slots."""
        self.runtime = runtime
        self.mode = mode
        self.timeout_s = timeout_s

    def recall(self, host_units: torch.Tensor, slots: torch.Tensor, need: torch.Tensor, *, tag: int) -> None:
        """Copy host units to device slots where `need`; returns once later device work sees them.
        host_units, slots: [R, K] int64 on the model's device; need: [R, K] bool."""
        ids, dst, count = compact(host_units, slots, need)
        if self.mode is RecallMode.DOORBELL:
            done = self.runtime.post_recall(host_ids=ids, device_slots=dst, count=count, tag=tag)
            done.device_wait()
        else:
            n = int(count)                                     # the baseline's sync: ids go to the host
            if n == 0:
                return
            done = self.runtime.recall(host_ids=ids[:n].cpu(), device_slots=dst[:n].cpu(), tag=tag)
            try:
                done.wait(self.timeout_s)
            except pulseio.WaitTimeout as exc:
                raise RecallError(f"a synchronous recall of {n} units for layer {tag} did not land within "
                                  f"{self.timeout_s} s") from exc
            except pulseio.PulseError as exc:
                raise RecallError(f"the recall for layer {tag} failed: {exc}") from exc
        if done.exception() is not None:
            raise RecallError(f"the recall for layer {tag} failed: {done.exception()}") from done.exception()
