"""Transfer statistics reported through vLLM's connector stats channel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from ucm_connector.prom import CounterMetrics
from ucmctl.core.metric_names import ucm_counter
from ucmctl.core.store_errors import LOAD_KINDS, LOOKUP_KINDS, SAVE_KINDS, WAIT_OPS, error_kind

__all__ = ["UCMConnectorStats", "UCMPromMetrics", "error_kind"]

_FIELDS = (
    "load_bytes",
    "load_s",
    "load_blocks",
    "load_errors",
    "save_bytes",
    "save_s",
    "save_blocks",
    "save_errors",
    # errors by kind (ucmctl.core.store_errors): load_errors_estale, ..., save_errors_dropped
    *(f"load_errors_{kind}" for kind in LOAD_KINDS),
    *(f"save_errors_{kind}" for kind in SAVE_KINDS),
    "lookup_errors",
    *(f"lookup_errors_{kind}" for kind in LOOKUP_KINDS),
    # store waits that outlasted their bound by more than a second (never, if bounding works)
    *(f"{op}_waits_over_bound" for op in WAIT_OPS),
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
            "Load errors (storage)": d["load_errors_estale"]
            + d["load_errors_enotconn"]
            + d["load_errors_eio"],
            "Load timeouts": d["load_errors_timeout"],
            "GB loaded": round(d["load_bytes"] / 1e9, 4),
            "Load GB/s": gbps(d["load_bytes"], d["load_s"]),
            "Blocks saved": d["save_blocks"],
            "Lookup errors": d["lookup_errors"],
            "Save errors": d["save_errors"],
            "Save timeouts": d["save_errors_timeout"],
            "Saves dropped": d["save_errors_dropped"],
            "GB saved": round(d["save_bytes"] / 1e9, 4),
            "Save GB/s": gbps(d["save_bytes"], d["save_s"]),
            "Waits over bound": sum(d[f"{op}_waits_over_bound"] for op in WAIT_OPS),
        }

    def is_empty(self) -> bool:
        return not (
            self.data["load_blocks"]
            or self.data["save_blocks"]
            or self.data["load_errors"]
            or self.data["save_errors"]
            or self.data["lookup_errors"]
            or any(self.data[f"{op}_waits_over_bound"] for op in WAIT_OPS)
        )

    @classmethod
    def from_data(cls, data: dict[str, Any] | None) -> UCMConnectorStats:
        return cls(data=dict(data or {}))


class UCMPromMetrics(CounterMetrics):
    """The connector's transfer stats as Prometheus counters, one per stats field."""

    COUNTERS = tuple(
        (key, ucm_counter(key), doc)
        for key, doc in (
            ("load_blocks", "Blocks loaded from the UCM store"),
            ("load_bytes", "Bytes loaded from the UCM store"),
            ("load_s", "Seconds spent loading from the UCM store"),
            ("load_errors", "Blocks the UCM store could not deliver (recomputed)"),
            ("save_blocks", "Blocks saved to the UCM store"),
            ("save_bytes", "Bytes saved to the UCM store"),
            ("save_s", "Seconds spent saving to the UCM store"),
            ("save_errors", "Blocks the UCM store failed to save"),
            ("load_errors_estale", "Load errors: stale file handle (ESTALE)"),
            ("load_errors_enotconn", "Load errors: storage not connected (ENOTCONN)"),
            ("load_errors_eio", "Load errors: I/O error (EIO)"),
            ("load_errors_timeout", "Load errors: not finished in time"),
            ("load_errors_corrupt", "Load errors: block failed its checksum"),
            ("save_errors_timeout", "Save errors: not stored in time"),
            ("lookup_errors", "Lookups the storage failed to answer (misses)"),
            *((f"lookup_errors_{k}", f"Lookup errors: {k}") for k in LOOKUP_KINDS),
            ("save_errors_dropped", "Save errors: dropped, the storage is far behind"),
            *((f"{op}_waits_over_bound", f"UCM store {op}s over their bound + 1 s") for op in WAIT_OPS),
        )
    )

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, _, _ in self.COUNTERS:
            self.add(key, engine_idx, transfer_stats_data.get(key, 0))
