"""Selected minus resident: which selected blocks a request must recall into its hot cache, and
into which of its hot slots, in fixed-shape tensors (no host sync, no per-block loop).

Each row (a request, or a request's KV head when heads select separately) owns `num_slots` hot
slots. `resident[r, b]` is the slot holding logical block b of row r, or -1. A selected block that is
resident stays where it is; the others take the free slots: first the empty ones, then those of
resident blocks this step did not select (which are evicted). Which of those go: given each slot's
`age` (calls since its block was last selected), the least recently selected, ties to the lower slot,
so that a hot set larger than the selection keeps the blocks a row may select again; without ages,
lower slot first. Either way the slots taken are used in ascending slot order. With num_slots >= K
there is always room.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .selection import PAD


@dataclass(frozen=True)
class RecallPlan:
    blocks: torch.Tensor          # [R, K] int64: selected blocks not resident, ascending, then -1
    slots: torch.Tensor           # [R, K] int64: the hot slot each of `blocks` goes to, or -1
    evicted: torch.Tensor         # [R, K] int64: the block that held that slot before, or -1
    selected_slots: torch.Tensor  # [R, K] int64: the slot of every selected block after the recall, or -1


def plan_recall(selected: torch.Tensor, resident: torch.Tensor, num_slots: int,
                age: torch.Tensor | None = None) -> RecallPlan:
    """selected: [R, K] int64 block ids, -1 padded (from `select_blocks`, flattened to rows);
    resident: [R, NB] int64 block -> hot slot in [0, num_slots) or -1, no slot held twice;
    age: [R, num_slots] int, calls since each slot's block was last selected (`touch`), or None."""
    r, k = selected.shape
    if num_slots < k:
        raise ValueError(f"num_slots ({num_slots}) must be at least the selection width K ({k}), "
                         "or selected blocks could find no slot; give each row at least budget_blocks hot slots")
    valid = selected >= 0
    current = torch.where(valid, resident.gather(1, selected.clamp(min=0)), PAD)     # [R, K]
    need = valid & (current < 0)
    slot_ids = torch.arange(num_slots, device=selected.device)
    held = _mark(current, num_slots)                       # [R, S] slots of selected resident blocks
    occupied = _mark(resident, num_slots)                  # [R, S] slots of any resident block
    victim = occupied & ~held                              # evictable
    if age is not None:                                    # only the oldest as many as the empty slots lack
        lack = (need.sum(1) - (~occupied).sum(1)).clamp(min=0)
        oldest = torch.where(victim, age.long() * num_slots + num_slots - 1 - slot_ids, -1)
        order = oldest.argsort(dim=1, descending=True, stable=True)
        place = torch.empty_like(order).scatter_(1, order, slot_ids.expand_as(order).contiguous())
        victim = victim & (place < lack[:, None])
    key = slot_ids + num_slots * (occupied.long() + (occupied & ~victim).long())   # empty < victim < kept
    free = key.argsort(dim=1)                                       # [R, S]
    rank = need.long().cumsum(1) - 1                                # [R, K] recall rank of each needed block
    assigned = torch.where(need, free.gather(1, rank.clamp(min=0)), PAD)
    order = (~need).long().argsort(dim=1, stable=True)             # needed blocks first, in order
    blocks = torch.where(need.gather(1, order), selected.gather(1, order), PAD)
    slots = assigned.gather(1, order)
    owner = torch.full((r, num_slots + 1), PAD, dtype=torch.long, device=selected.device)
    blocks_all = torch.arange(resident.shape[1], device=selected.device).expand_as(resident)
    owner.scatter_(1, torch.where(resident >= 0, resident, num_slots), blocks_all)
    evicted = torch.where(slots >= 0, owner.gather(1, slots.clamp(min=0)), PAD)
    return RecallPlan(blocks, slots, evicted, torch.where(need, assigned, current))


def apply_recall(resident: torch.Tensor, plan: RecallPlan) -> torch.Tensor:
    """The residency map after `plan` is carried out: evicted blocks -> -1, recalled blocks -> their slot.
    resident: [R, NB] -> [R, NB] (a new tensor)."""
    r, nb = resident.shape
    out = torch.cat([resident, resident.new_full((r, 1), PAD)], dim=1)      # column NB absorbs padding
    out.scatter_(1, torch.where(plan.evicted >= 0, plan.evicted, nb), PAD)
    out.scatter_(1, torch.where(plan.blocks >= 0, plan.blocks, nb), plan.slots)
    return out[:, :nb]


def touch(age: torch.Tensor, plan: RecallPlan) -> torch.Tensor:
    """The slots' ages after `plan`: 0 for the slots of this step's selected blocks, one more for the rest.
    age: [R, num_slots] int -> a new tensor of its dtype."""
    used = _mark(plan.selected_slots, age.shape[1])
    return torch.where(used, 0, age + 1).to(age.dtype)


def _mark(slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    """slots: [R, N] slot ids or -1 -> [R, num_slots] bool, True where some entry names the slot."""
    marks = torch.zeros((slots.shape[0], num_slots + 1), dtype=torch.bool, device=slots.device)
    return marks.scatter_(1, torch.where(slots >= 0, slots, num_slots), True)[:, :num_slots]
