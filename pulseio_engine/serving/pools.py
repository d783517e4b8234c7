"""What the serving engines allocate for a `ServingConfig`'s GPU and host budgets, known before building them.

Each pool is large enough for whatever the `KVBudget` admits into it: the normal engine's paged cache for the
whole GPU budget, the offload engine's for its dense layers, a hot set (`ServingConfig.hot_cache` budgets) for
every offload request the budget could hold at the threshold's length, and the host pool's units.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import DType, ModelConfig, OffloadConfig
from ..engine import TORCH_DTYPES
from ..kv.offload_layout import UnitLayout
from .budget import Footprint, KVClass
from .config import ServingConfig


@dataclass(frozen=True)
class PoolSizes:
    """What the engines allocate for a budget (see `pool_sizes`)."""

    normal_blocks: int       # the normal engine's paged cache, block 0 included
    offload_blocks: int      # the offload engine's paged cache (dense layers), block 0 included; 0: none
    max_offload: int         # offload requests with hot sets
    host_units: int          # the host pool, unit 0 included

    def device_bytes(self, fp: Footprint) -> int:
        """The KV-side device memory these pools take (paged caches with their digests, hot sets)."""
        return self.normal_blocks * fp.normal_block + self.offload_blocks * fp.offload_block \
            + self.max_offload * fp.offload_fixed


def plan_pools(config: ServingConfig, model: ModelConfig, dtype: DType) -> tuple[Footprint, PoolSizes]:
    """What a request holds by class, and the pools engines built for `config` allocate (before building them)."""
    elem = TORCH_DTYPES[dtype].itemsize
    hot, unit = config.token_budget // config.block_size, 0       # (no offload engine: no hot set is charged)
    if config.has_offload:
        offload = OffloadConfig(sparse=config.sparse_config(), dense_layers=config.dense_layers,
                                hot_cache=config.hot_cache)
        hot, unit = offload.hot_blocks, UnitLayout.for_mode(model, offload, elem).unit_bytes
    fp = Footprint.for_model(model, elem_bytes=elem, block_size=config.block_size, dense_layers=config.dense_layers,
                             hot_blocks=hot, selection=config.sparse)
    return fp, pool_sizes(config, fp, unit)


def pool_sizes(config: ServingConfig, fp: Footprint, unit_bytes: int) -> PoolSizes:
    gpu = config.gpu_kv_bytes
    normal = 1 + gpu // fp.normal_block
    if not config.has_offload:
        return PoolSizes(normal, 0, 0, 0)
    at_threshold = fp.device_bytes(KVClass.OFFLOAD, config.offload_threshold)
    max_offload = config.max_offload_seqs or max(1, min(config.max_batch, gpu // at_threshold))
    host_blocks = config.host_kv_bytes // fp.host_block
    offload = 1 + max(1, min((gpu - fp.offload_fixed) // fp.offload_block, host_blocks))
    return PoolSizes(normal, offload, max_offload, 1 + config.host_kv_bytes // unit_bytes)
