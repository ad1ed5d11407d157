"""vLLM's `MooncakeConnector`, with the Prometheus metrics MultiConnector requires.

In a P2P prefill server the connectors are composed by vLLM's MultiConnector [Mooncake, UCM].
MultiConnector sends each child's transfer stats to that child's Prometheus metrics and asserts
that every child reporting stats has them; vLLM's MooncakeConnector reports stats after each
transfer but (up to 0.33) builds no metrics, so the server's first P2P transfer ends in an
AssertionError. This subclass is the same connector under the same name (so stats are rebuilt
by vLLM's registry entry) and adds counters for what it reports. Where vLLM's own class already
builds metrics, those are used unchanged.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import (
    MooncakeConnector as _VllmMooncakeConnector,
)

from ucm_connector.prom import CounterMetrics
from ucmctl.core.metric_names import MOONCAKE_COUNTERS


class MooncakePromMetrics(CounterMetrics):
    """Counters for vLLM's MooncakeKVConnectorStats, whose values are lists (one per event)."""

    COUNTERS = tuple(
        (key, MOONCAKE_COUNTERS[key], doc)
        for key, doc in (
            ("transfers", "Mooncake P2P transfers that succeeded"),
            ("bytes_transferred", "Bytes sent by Mooncake P2P transfers"),
            ("transfer_duration", "Seconds spent in Mooncake P2P transfers"),
            ("num_descriptors", "Memory descriptors of Mooncake P2P transfers"),
            ("num_failed_transfers", "Mooncake P2P transfers that failed"),
            ("num_failed_recvs", "Mooncake P2P receives that failed"),
            ("num_kv_expired_reqs", "Requests whose KV expired unsent"),
        )
    )

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        self.add("transfers", engine_idx, len(transfer_stats_data.get("transfer_duration") or []))
        for key, _, _ in self.COUNTERS[1:]:
            self.add(key, engine_idx, sum(transfer_stats_data.get(key) or []))


class MooncakeConnector(_VllmMooncakeConnector):
    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        own = super().build_prom_metrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        if own is not None:
            return own
        return MooncakePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
