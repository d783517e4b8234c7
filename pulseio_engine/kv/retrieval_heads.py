"""Which KV head of each layer retrieves for SoloHead: the calibration's result, stored as JSON.

CPU-only bookkeeping (no torch). `best[l]` is the KV head of layer l whose dense attention puts the
most probability on the middle of the context (outside the sink and local windows); `worst[l]` the
least, the control of the `solohead-reversed` mode.

    {"model": "...", "best": [3, 1, ...], "worst": [0, 2, ...], "num_kv_heads": 4, ...}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import SparseMode


@dataclass(frozen=True)
class RetrievalHeads:
    """Per-layer retrieval KV heads. `extra` holds whatever else the calibration recorded (scores,
    stability); it is saved and loaded but never read by the engine."""

    num_kv_heads: int
    best: tuple[int, ...]
    worst: tuple[int, ...]
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if len(self.best) != len(self.worst):
            raise ValueError(f"RetrievalHeads.best has {len(self.best)} layers and worst {len(self.worst)}; "
                             "they must name one head per layer each")
        for name, heads in (("best", self.best), ("worst", self.worst)):
            bad = [h for h in heads if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < self.num_kv_heads]
            if bad:
                raise ValueError(f"RetrievalHeads.{name} holds {bad}, not KV heads in [0, {self.num_kv_heads})")

    @property
    def num_layers(self) -> int:
        return len(self.best)

    def heads_for(self, mode: SparseMode) -> tuple[int, ...] | None:
        """The head that selects, per layer, for `mode`; None for QUEST (every head selects)."""
        return {SparseMode.QUEST: None, SparseMode.SOLOHEAD: self.best,
                SparseMode.SOLOHEAD_REVERSED: self.worst}[mode]

    def to_json(self) -> str:
        return json.dumps({"num_kv_heads": self.num_kv_heads, "best": list(self.best), "worst": list(self.worst),
                           **self.extra}, indent=1)

    def save(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: Path) -> RetrievalHeads:
        return cls.from_json(path.read_text(), source=str(path))

    @classmethod
    def from_json(cls, text: str, *, source: str = "retrieval heads") -> RetrievalHeads:
        d = json.loads(text)
        missing = {"num_kv_heads", "best", "worst"} - d.keys()
        if missing:
            raise ValueError(f"{source}: retrieval-head file lacks {sorted(missing)}; write it with "
                             "`pulseio-engine calibrate`")
        extra = {k: v for k, v in d.items() if k not in {"num_kv_heads", "best", "worst"}}
        return cls(d["num_kv_heads"], tuple(d["best"]), tuple(d["worst"]), extra)
