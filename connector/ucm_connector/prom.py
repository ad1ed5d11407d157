"""Prometheus counters for a connector's transfer stats, labelled per engine as vLLM's are."""

from __future__ import annotations

from typing import Any, ClassVar

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

from ucm_connector.compat import metric_per_engine


class CounterMetrics(KVConnectorPromMetrics):
    """One counter per (key, metric name, help) in COUNTERS; subclasses say how stats map to keys.

    prometheus_client adds `_total` to each counter's name on /metrics.
    """

    COUNTERS: ClassVar[tuple[tuple[str, str, str], ...]] = ()

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {
            key: metric_per_engine(
                self._counter_cls(name=name, documentation=doc, labelnames=labelnames),
                per_engine_labelvalues,
            )
            for key, name, doc in self.COUNTERS
        }

    def add(self, key: str, engine_idx: int, value: float) -> None:
        if value:
            self._counters[key][engine_idx].inc(value)
