"""Transfer statistics reported through vLLM's connector stats channel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

_FIELDS = (
    "load_bytes",
    "load_s",
    "load_blocks",
    "load_errors",
    "save_bytes",
    "save_s",
    "save_blocks",
    "save_errors",
)


@dataclass
class UCMConnectorStats(KVConnectorStats):
    """Bytes, seconds and block counts of loads and saves over one logging interval."""

    def __post_init__(self) -> None:
        for name in _FIELDS:
            self.data.setdefault(name, 0)

    def add(self, **values: float) -> None:
        for name, value in values.items():
            self.data[name] += value

    def reset(self) -> None:
        for name in _FIELDS:
            self.data[name] = 0

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name in _FIELDS:
            self.data[name] += other.data.get(name, 0)
        return self

    def reduce(self) -> dict[str, int | float]:
        d = self.data
        gbps = lambda b, s: round(b / s / 1e9, 3) if s > 0 else 0.0  # noqa: E731
        return {
            "Blocks loaded": d["load_blocks"],
            "Load errors": d["load_errors"],
            "GB loaded": round(d["load_bytes"] / 1e9, 4),
            "Load GB/s": gbps(d["load_bytes"], d["load_s"]),
            "Blocks saved": d["save_blocks"],
            "Save errors": d["save_errors"],
            "GB saved": round(d["save_bytes"] / 1e9, 4),
            "Save GB/s": gbps(d["save_bytes"], d["save_s"]),
        }

    def is_empty(self) -> bool:
        return not (
            self.data["load_blocks"]
            or self.data["save_blocks"]
            or self.data["load_errors"]
            or self.data["save_errors"]
        )

    @classmethod
    def from_data(cls, data: dict[str, Any] | None) -> UCMConnectorStats:
        return cls(data=dict(data or {}))
