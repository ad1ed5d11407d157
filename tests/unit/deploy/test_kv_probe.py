"""The KV probe's pure parts: which deployments it applies to, and reading counters."""

from __future__ import annotations

import io
import json
import urllib.error
from pathlib import Path

from ucmctl.deploy.kv_probe import _why, applies, counter
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import load_topology, parse_topology

REPO = Path(__file__).resolve().parents[3]

METRICS = """# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 12.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 1000.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="external_kv_transfer"} 24.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 896.0
"""


def test_counter_sums_matching_samples_and_says_when_absent() -> None:
    assert counter(METRICS, "vllm:prompt_tokens_by_source_total", 'source="external_kv_transfer"') == 1024
    assert counter(METRICS, "vllm:external_prefix_cache_hits_total", "") == 896
    assert counter(METRICS, "vllm:nope_total", "") is None  # absent is not zero


def test_probe_applies_where_kv_crosses_instances() -> None:
    assert applies(build_plan(load_topology("topologies/2p2d-p2p.yaml"))) is None
    assert applies(build_plan(load_topology("topologies/2p2d-centralized.yaml"))) is None
    assert "mixed mode" in str(applies(build_plan(load_topology("topologies/pd-mixed.yaml"))))
    no_store = parse_topology(
        "name: n\nmode: centralized\nmodel: {path: /m}\nnodes: {a: {host: 10.0.0.1}}\n"
        "prefill: {nodes: [a], port: 9000}\ndecode: {nodes: [a], port: 9100}\nproxy: {node: a}\n"
    )
    assert "without the UCM store" in str(applies(build_plan(no_store)))


def test_a_failed_probe_request_is_one_line_with_the_proxys_reason() -> None:
    message = "prefill instance http://a:9000: Mooncake bootstrap\nhttp://a:8998 gave no engine"
    body = json.dumps({"error": {"message": message}}).encode()
    exc = urllib.error.HTTPError("http://p/v1", 502, "Bad Gateway", {}, io.BytesIO(body))  # type: ignore[arg-type]
    assert _why(exc) == "HTTP 502: " + message.replace("\n", " ")
    assert _why(urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))) == (
        "[Errno 111] Connection refused"
    )


def test_the_probe_fits_the_servers_max_model_len() -> None:
    from ucmctl.deploy.kv_probe import PROBE_TOKENS, probe_tokens

    plan = build_plan(load_topology("topologies/local-1p1d.yaml"))
    assert probe_tokens(plan) == PROBE_TOKENS  # max-model-len 8192: the full probe
    short = plan.model_copy(deep=True)
    for p in short.processes:
        if p.is_server:
            p.argv[p.argv.index("--max-model-len") + 1] = "1024"
    assert probe_tokens(short) == 1022  # two tokens left for the answer


def test_a_probe_that_moved_no_kv_names_the_storage_errors_counted_meanwhile(monkeypatch) -> None:
    from ucmctl.deploy import kv_probe

    plan = build_plan(load_topology("topologies/2p2d-centralized.yaml"))
    assert plan.store is not None and plan.store.users
    calls = {"n": 0}
    decode = {p.url for p in plan.processes if p.role == "decode"}
    first_prefill = next(p for p in plan.processes if p.role == "prefill")

    def get(url: str, timeout: float) -> str:
        calls["n"] += 1
        base = url.removesuffix("/metrics")
        text = 'vllm:external_prefix_cache_hits_total{engine="0"} 0.0\n' if base in decode else ""
        if base == first_prefill.url and calls["n"] > len(plan.store.users):  # after the request
            text += 'vllm:ucm_save_errors_total{engine="0"} 8.0\n'
            text += 'vllm:ucm_save_errors_timeout_total{engine="0"} 8.0\n'
        return text

    monkeypatch.setattr(kv_probe, "_get", get)
    monkeypatch.setattr(kv_probe, "_post", lambda url, body, timeout: {})
    monkeypatch.setattr(kv_probe.time, "sleep", lambda s: None)
    monkeypatch.setattr(kv_probe.time, "monotonic", iter(range(0, 10_000, 20)).__next__)
    result = kv_probe.run_probe(plan)
    assert not result.ok and "decode found nothing prefill stored" in result.detail
    assert result.detail.endswith(
        f"; the UCM store failed meanwhile: {first_prefill.name} save 8 (timeout 8)"
    )


def test_with_roles_per_request_the_store_is_proved_between_two_instances(monkeypatch) -> None:
    """Both legs may go to one instance through the proxy: the probe sends the prompt to the
    first prefill, then to the first decode directly, then one request through the proxy."""
    from ucmctl.deploy import kv_probe

    text = (REPO / "topologies" / "2p2d-centralized.yaml").read_text()
    plan = build_plan(parse_topology(text.replace("\nproxy:\n", "\nproxy:\n  roles: dynamic\n", 1)))
    prefill = next(p for p in plan.processes if p.role == "prefill")
    decode = next(p for p in plan.processes if p.role == "decode")
    proxy = next(p for p in plan.processes if p.role == "proxy")
    posted: list[str] = []
    hits = {"n": 0.0}

    def post(url: str, body: dict, timeout: float) -> dict:
        posted.append(url.removesuffix("/v1/completions"))
        if url.startswith(str(decode.url)):
            hits["n"] += 1024  # what decode loaded of what prefill stored
        return {}

    def get(url: str, timeout: float) -> str:
        return f'vllm:external_prefix_cache_hits_total{{engine="0"}} {hits["n"]}\n'

    monkeypatch.setattr(kv_probe, "_get", get)
    monkeypatch.setattr(kv_probe, "_post", post)
    result = kv_probe.run_probe(plan)
    assert posted == [prefill.url, decode.url, proxy.url]
    assert result.ok and result.detail == (
        f"centralized, roles per request: {prefill.name} -> {decode.name}: external prefix hits grew "
        "by 1024 for a 1100-token probe; the proxy answered"
    )
