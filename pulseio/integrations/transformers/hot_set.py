"""HotSet: which block each hot-set entry of one layer holds on the device, and the plan that turns a new
selection into the recall it needs (this module imports no transformers).

Each of R rows (batch row x selecting head) owns K entries: device slots slot0[r] .. slot0[r] + K - 1, and
its blocks live in host units unit0[r] + block. A step's selection keeps the entries whose blocks it selects
again and gives each selected block that is not resident a free entry, in order (the i-th missing block
takes the i-th free entry). Entries freed but not reused keep their block, which a later selection can
pick up again without a recall. Everything is a handful of gathers, scatters, a cumsum and two sorts over
[R, K] or [R, NB] tensors on the device: no loop per block, no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RecallPlan:
    """One layer's recall, for `Runtime.post_recall`: the needed (host unit, device slot) pairs lead.

    host_ids, device_slots: [R * K] int64, device; count: [1] int64, device (how many pairs lead);
    slots: [R, K] int64, the device slot of each selected block once the recall has landed (padding: a
    slot of the row, whose rows the caller leaves out); selected: [R, K] the selection planned for."""

    host_ids: torch.Tensor
    device_slots: torch.Tensor
    count: torch.Tensor
    slots: torch.Tensor
    selected: torch.Tensor


class HotSet:
    """Residency of one layer's hot set (see the module doc). unit0, slot0: [R] int64 on `device`."""

    def __init__(self, unit0: torch.Tensor, slot0: torch.Tensor, entries: int, max_blocks: int) -> None:
        rows, device = unit0.shape[0], unit0.device
        self.entries, self.max_blocks = entries, max_blocks
        self.unit0, self.slot0 = unit0[:, None], slot0[:, None]                                 # [R, 1] each
        # one trash column each (index K, index NB): writes that must go nowhere go there, and stay -1
        self.resident = torch.full((rows, entries + 1), -1, dtype=torch.int64, device=device)  # [R, K+1] block
        self.where = torch.full((rows, max_blocks + 1), -1, dtype=torch.int64, device=device)  # [R, NB+1] entry

    def reset(self) -> None:
        self.resident.fill_(-1)
        self.where.fill_(-1)

    def plan(self, selected: torch.Tensor) -> RecallPlan:
        """selected: [R, K] int64 block ids (ascending, -1 padding) -> the recall that makes them resident.
        The residency is updated as if it had landed: post the recall before anything reads the slots."""
        k, nb = self.entries, self.max_blocks
        valid = selected >= 0
        hit_entry = self.where.gather(1, torch.where(valid, selected, nb))                 # [R, K], -1: absent
        hit = hit_entry >= 0
        missing = valid & ~hit
        kept = torch.zeros_like(self.resident, dtype=torch.bool)
        kept.scatter_(1, torch.where(hit, hit_entry, k), True)
        free_first = torch.sort(kept[:, :k].to(torch.int8), dim=1, stable=True).indices     # [R, K]
        rank = (missing.cumsum(1) - 1).clamp(min=0)
        dest = torch.where(missing, free_first.gather(1, rank), k)                         # [R, K]; K: trash
        evicted = self.resident.gather(1, dest)                                             # [R, K] old blocks
        self.where.scatter_(1, torch.where(evicted >= 0, evicted, nb), -1)
        self.resident.scatter_(1, dest, torch.where(missing, selected, -1))
        self.where.scatter_(1, torch.where(missing, selected, nb), torch.where(missing, dest, -1))
        self.resident[:, k] = -1
        self.where[:, nb] = -1
        entry = torch.where(hit, hit_entry, torch.where(missing, dest, 0))                 # [R, K]
        order = torch.argsort((~missing).reshape(-1).to(torch.int8), stable=True)         # needed pairs first
        host_ids = (self.unit0 + selected.clamp(min=0)).reshape(-1)[order]
        device_slots = (self.slot0 + dest.clamp(max=k - 1)).reshape(-1)[order]
        return RecallPlan(host_ids=host_ids.contiguous(), device_slots=device_slots.contiguous(),
                          count=missing.sum().reshape(1), slots=self.slot0 + entry, selected=selected)
