"""The hit counters and the time series are read under the names of the run's engine (vLLM's by
default): an engine with series of its own passes its `Metrics`."""

from __future__ import annotations

import dataclasses

from ucmctl.bench import hitrate, series
from ucmctl.engines import ENGINES

VLLM = ENGINES["vllm"].metrics
OTHER = dataclasses.replace(
    VLLM,
    requests_running="other:running",
    local_queries="other:queries",
    local_hits="other:hits",
    prompt_tokens_by_source="other:by_source",
    transfer_source="kv",
)
TEXT = """other:running{engine="0"} 3.0
other:queries_total{engine="0"} 100.0
other:hits_total{engine="0"} 40.0
other:hits_total{engine="1"} 2.0
other:by_source_total{source="kv"} 64.0
vllm:prefix_cache_hits_total{engine="0"} 999.0
"""


def test_hit_counters_under_the_engines_names() -> None:
    counters = hitrate.parse_counters(TEXT, OTHER)
    assert (counters["local_queries"], counters["local_hits"]) == (100.0, 42.0)
    assert hitrate.parse_counters(TEXT)["local_hits"] == 999.0  # the default: vLLM's
    assert hitrate.counter_names(OTHER).keys() == hitrate.COUNTERS.keys()


def test_series_under_the_engines_names() -> None:
    assert series.parse(TEXT, OTHER) == {
        "running": 3.0,
        "local_queries": 100.0,
        "local_hits": 42.0,
        "kv_transfer_tokens": 64.0,
    }
    assert series.parse(TEXT) == {"local_hits": 999.0}
