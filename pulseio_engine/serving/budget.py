"""What a request holds by class, and the caps every mode is held to: GPU KV bytes, host pool bytes. No torch.

A request's class says where its KV lives:

- NORMAL: every layer's KV in the GPU's paged cache (and, in the sparse modes, its block digests);
- OFFLOAD: the dense layers' KV and the digests on the GPU, the other layers' KV in the host pool, and a hot
  set of `hot_blocks` slots (`OffloadConfig.hot_blocks`: a budget, or `hot_cache` budgets) per offloaded layer
  on the GPU, whatever the request's length.

`KVBudget` charges each running request what its class holds for its whole reservation (prompt +
max_new_tokens, as the engines reserve blocks) against `gpu_bytes` (the `--gpu-kv-gib` every mode is held
to) and `host_bytes` (the host pool). The engines' pools are sized so that whatever the budget admits fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from ..config import ModelConfig, SparseMode
from ..errors import KVBudgetError
from ..kv.block_table import blocks_for

Lack = Literal["row", "gpu", "host"]     # what keeps a waiting request out: a batch row, GPU bytes, host bytes


class KVClass(Enum):
    """Where a request's KV lives (see the module doc)."""

    NORMAL = "normal"
    OFFLOAD = "offload"


@dataclass(frozen=True)
class Footprint:
    """Bytes a request holds, per block of its reservation and fixed, by class."""

    block_size: int
    normal_block: int       # GPU: every layer's KV of one block, and its digests
    offload_block: int      # GPU: the dense layers' KV of one block, and its digests
    offload_fixed: int      # GPU: an offload request's hot slots
    host_block: int         # host: the offloaded layers' KV of one block

    @classmethod
    def for_model(cls, model: ModelConfig, *, elem_bytes: int, block_size: int, dense_layers: int,
                  hot_blocks: int, selection: SparseMode | None) -> Footprint:
        """`selection` None: dense attention, no digests. Digests are kept for every layer of a block (as
        `BlockDigests` allocates them): Hkv heads wide for Quest, one for SoloHead. `hot_blocks`: an offload
        request's hot-set entries per offloaded layer (each every KV head's K and V of a block)."""
        token_layer = 2 * model.num_kv_heads * model.head_dim * elem_bytes          # K and V, one layer
        width = 0 if selection is None else (model.num_kv_heads if selection is SparseMode.QUEST else 1)
        digests = model.num_layers * width * model.head_dim * 2 * elem_bytes         # max and min
        offloaded = model.num_layers - dense_layers
        return cls(block_size, model.num_layers * block_size * token_layer + digests,
                   dense_layers * block_size * token_layer + digests,
                   offloaded * hot_blocks * block_size * token_layer, offloaded * block_size * token_layer)

    def device_bytes(self, kv_class: KVClass, tokens: int) -> int:
        blocks = blocks_for(tokens, self.block_size)
        if kv_class is KVClass.NORMAL:
            return blocks * self.normal_block
        return blocks * self.offload_block + self.offload_fixed

    def host_bytes(self, kv_class: KVClass, tokens: int) -> int:
        return 0 if kv_class is KVClass.NORMAL else blocks_for(tokens, self.block_size) * self.host_block


@dataclass(frozen=True)
class BudgetStatistics:
    gpu_bytes: int
    gpu_used: int
    host_bytes: int
    host_used: int
    normal: int             # running requests by class
    offload: int


class KVBudget:
    """Running requests' GPU and host bytes against the caps (see the module doc)."""

    def __init__(self, footprint: Footprint, *, gpu_bytes: int, host_bytes: int) -> None:
        self.footprint = footprint
        self.gpu_bytes, self.host_bytes = gpu_bytes, host_bytes
        self._held: dict[int, tuple[KVClass, int, int, int]] = {}     # rid -> (class, tokens, gpu, host)
        self._counts = dict.fromkeys(KVClass, 0)
        self.gpu_used = self.host_used = 0

    def kv_class(self, rid: int) -> KVClass:
        return self._held[rid][0]

    def count(self, kv_class: KVClass) -> int:
        """Running requests of the class."""
        return self._counts[kv_class]

    def fits(self, kv_class: KVClass, tokens: int, *, freeing: int | None = None) -> bool:
        """Whether a request of `tokens` reserved tokens fits as `kv_class`, once `freeing`'s charge (a request
        moving to that class) is released."""
        return self.lacks(kv_class, tokens, freeing=freeing) is None

    def lacks(self, kv_class: KVClass, tokens: int, *, freeing: int | None = None) -> Lack | None:
        """What such a request lacks to fit: "gpu" (GPU bytes, checked first), "host" (host pool bytes), or None."""
        _, _, gpu0, host0 = self._held[freeing] if freeing is not None else (None, 0, 0, 0)
        fp = self.footprint
        if self.gpu_used - gpu0 + fp.device_bytes(kv_class, tokens) > self.gpu_bytes:
            return "gpu"
        if self.host_used - host0 + fp.host_bytes(kv_class, tokens) > self.host_bytes:
            return "host"
        return None

    def fits_alone(self, kv_class: KVClass, tokens: int) -> bool:
        """Whether such a request fits an empty engine (if not, it can never be admitted as `kv_class`)."""
        fp = self.footprint
        return (fp.device_bytes(kv_class, tokens) <= self.gpu_bytes
                and fp.host_bytes(kv_class, tokens) <= self.host_bytes)

    def charge(self, rid: int, kv_class: KVClass, tokens: int) -> None:
        if rid in self._held:
            self.release(rid)
        if not self.fits(kv_class, tokens):
            raise KVBudgetError(f"request {rid} ({tokens} tokens, {kv_class.value}) does not fit the KV budget "
                                "(check fits() first; this is a bug in pulseio_engine)")
        gpu, host = self.footprint.device_bytes(kv_class, tokens), self.footprint.host_bytes(kv_class, tokens)
        self._held[rid] = (kv_class, tokens, gpu, host)
        self._counts[kv_class] += 1
        self.gpu_used += gpu
        self.host_used += host

    def release(self, rid: int) -> None:
        kv_class, _, gpu, host = self._held.pop(rid)
        self._counts[kv_class] -= 1
        self.gpu_used -= gpu
        self.host_used -= host

    def statistics(self) -> BudgetStatistics:
        return BudgetStatistics(self.gpu_bytes, self.gpu_used, self.host_bytes, self.host_used,
                                self.count(KVClass.NORMAL), self.count(KVClass.OFFLOAD))


def size(nbytes: float) -> str:
    """Bytes for a person: '512 B', '3.0 KiB', '1.50 MiB', '20.00 GiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"
