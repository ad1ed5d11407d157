"""What the time series keep of a /metrics text, and the KV handover read from the proxy's
histogram: a quantile from the buckets within one bucket step of the exact one."""

from __future__ import annotations

import random
import statistics

from ucmctl.bench import handover, series
from ucmctl.proxy.metrics import HANDOVER_BUCKETS, Metrics

TEXT = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 800.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 96.0
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 512.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 77.0
vllm:ucm_load_errors_total 2.0
vllm:time_to_first_token_seconds_bucket{le="0.1"} 4.0
process_start_time_seconds 1.7e9
"""


def test_parse_keeps_the_series_summed_over_engines() -> None:
    assert series.parse(TEXT) == {
        "running": 5.0,
        "waiting": 7.0,
        "kv_usage": 0.25,
        "local_queries": 1000.0,
        "local_hits": 800.0,
        "external_hits": 96.0,
        "preemptions": 1.0,
        "kv_transfer_tokens": 512.0,
        "ucm_load_errors": 2.0,
    }


def test_handover_figures_from_the_proxys_histogram() -> None:
    m = Metrics()
    before = handover.parse(m.render([]))
    assert before is not None and before[2] == 0
    rng = random.Random(3)
    values = [rng.lognormvariate(-4.0, 0.8) for _ in range(2000)]  # ~18 ms median
    for v in values:
        m.kv_handover.observe(v)
    after = handover.parse(m.render([]))
    figures = handover.phase_figures(before, after)
    assert figures is not None and figures["count"] == 2000
    assert abs(figures["mean_ms"] - 1000 * statistics.fmean(values)) < 1e-6
    exact = statistics.quantiles(values, n=100)
    for key, q in (("p50_ms", exact[49]), ("p99_ms", exact[98])):
        assert abs(figures[key] / (1000 * q) - 1) < 0.25, (key, figures[key], 1000 * q)  # one bucket step
    assert HANDOVER_BUCKETS[1] / HANDOVER_BUCKETS[0] == 1.25
    none = handover.phase_figures(after, after)
    assert none == {"count": 0, "mean_ms": None, "p50_ms": None, "p99_ms": None}
    assert handover.phase_figures(after, before) is None  # the proxy restarted in between
    assert handover.parse("vllm:num_requests_running 1\n") is None  # not ucmctl's proxy
