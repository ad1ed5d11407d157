"""Prometheus text as a parser reads it, and the health state transitions."""

from __future__ import annotations

import pytest

from ucmctl.proxy.health import record_failure, record_success
from ucmctl.proxy.metrics import Metrics, escape
from ucmctl.proxy.pool import Instance, Pool


def test_render_parses_and_carries_values() -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    pool = Pool()
    a = pool.add("http://127.0.0.1:8000", "prefill")
    b = pool.add("http://127.0.0.1:8001", "decode")
    assert a and b
    a.acquire(120)
    b.healthy = False
    b.output_chunks_total = 256
    m = Metrics()
    m.requests["/v1/completions"] += 3
    m.errors["bad_request"] += 1
    m.retries["prefill"] += 2
    m.ttft.observe(0.003)
    text = m.render(pool.all(), deployment='dep"1')
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in parser.text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert samples[("ucmctl_proxy_requests_total", (("route", "/v1/completions"),))] == 3
    assert samples[("ucmctl_proxy_errors_total", (("reason", "bad_request"),))] == 1
    assert samples[("ucmctl_proxy_retries_total", (("leg", "prefill"),))] == 2
    assert samples[("ucmctl_proxy_ttft_seconds_bucket", (("le", "0.005"),))] == 1
    assert samples[("ucmctl_proxy_ttft_seconds_bucket", (("le", "0.0025"),))] == 0
    pre = (("instance", a.url), ("role", "prefill"))
    dec = (("instance", b.url), ("role", "decode"))
    assert samples[("ucmctl_proxy_instance_tokens_in_flight", pre)] == 120
    assert samples[("ucmctl_proxy_instance_requests_in_flight", pre)] == 1
    assert samples[("ucmctl_proxy_instance_healthy", dec)] == 0
    assert samples[("ucmctl_proxy_instance_output_chunks_total", dec)] == 256
    assert samples[("ucmctl_proxy_info", (("deployment", 'dep"1'),))] == 1


def test_render_carries_kvs_predicted_hits_and_the_tokenize_outcomes() -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    routing = {
        "policy": "kv",
        "index": "approximate",
        "blocks": 7,
        "predicted": {"http://a:1": {"legs": 2, "prompt": 700, "local": 320, "external": 64}},
        "tokenization": {"source": "exact", "exact": 5, "refused": 1, "failed": 0, "no_endpoint": 0},
    }
    text = Metrics().render([], routing=routing)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in parser.text_string_to_metric_families(text)
        for s in fam.samples
    }
    for kind, value in (("prompt", 700), ("local", 320), ("external", 64)):
        key = ("ucmctl_proxy_kv_predicted_tokens_total", (("instance", "http://a:1"), ("kind", kind)))
        assert samples[key] == value
    assert samples[("ucmctl_proxy_tokenize_total", (("outcome", "exact"),))] == 5
    assert samples[("ucmctl_proxy_tokenize_total", (("outcome", "refused"),))] == 1


def test_escape() -> None:
    assert escape('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


def test_out_after_n_failures_back_after_one_success() -> None:
    inst = Instance("http://127.0.0.1:1", "decode")
    record_failure(inst, 2)
    assert inst.healthy
    record_failure(inst, 2)
    assert not inst.healthy and inst.failures_total == 2
    record_success(inst)
    assert inst.healthy and inst.consecutive_failures == 0


def test_refused_connection_takes_it_out_at_once() -> None:
    inst = Instance("http://127.0.0.1:1", "decode")
    record_failure(inst, 5, refused=True)
    assert not inst.healthy


def test_removed_instance_does_not_come_back() -> None:
    inst = Instance("http://127.0.0.1:1", "decode", healthy=False, removed=True)
    record_success(inst)
    assert not inst.healthy
