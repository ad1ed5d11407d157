"""The proxy's spec in the Plan: its argv made in one place, from the topology's routing,
the servers' block size and the direct threshold; render --k8s writes the same argv with the
pods' addresses."""

from __future__ import annotations

import json

import pytest

from tests.unit.plan.conftest import TOPOLOGIES
from ucmctl.core.errors import UcmctlError
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan
from ucmctl.topology.load import parse_topology

BASE = (TOPOLOGIES / "2p2d-centralized.yaml").read_text()


def plan_with(*proxy_lines: str) -> Plan:
    assert "\nproxy:\n" in BASE, "the example writes its proxy as a block mapping"
    text = BASE.replace("\nproxy:\n", "\nproxy:\n" + "".join(f"  {line}\n" for line in proxy_lines), 1)
    return build_plan(parse_topology(text))


def proxy_of(plan: Plan):  # type: ignore[no-untyped-def]
    (p,) = [p for p in plan.processes if p.role == "proxy"]
    return p


def test_the_default_routing_adds_nothing_and_the_spec_says_it() -> None:
    p = proxy_of(plan_with("routing: load"))
    assert p.proxy is not None and p.proxy.routing == "least-loaded"
    assert p.argv == p.proxy.argv() and "--routing" not in p.argv and "--block-size" not in p.argv
    assert [u.role for u in p.proxy.upstreams].count("prefill") == 2


def test_kv_routing_and_direct_below_reach_the_proxys_command_line() -> None:
    p = proxy_of(plan_with("routing: kv", "direct_below: 256", "kv_events: false"))
    assert p.proxy is not None and p.proxy.routing == "kv" and p.proxy.direct_below == 256
    tail = p.argv[p.argv.index("--routing") :]
    assert tail == ["--routing", "kv", "--direct-below", "256"]  # the example sets no block size
    assert p.proxy.block_size is None
    assert p.argv == p.proxy.argv()
    assert proxy_of(plan_with("routing: prefix")).argv[-2:] == ["--routing", "affinity"]


def test_where_the_index_is_read_every_server_publishes_its_kv_events_and_the_proxy_reads_them() -> None:
    for routing in (["routing: kv"], ["direct_below: 100"]):
        plan = plan_with(*routing)
        p = proxy_of(plan)
        feeds = [p.argv[k + 1] for k, word in enumerate(p.argv) if word == "--kv-events"]
        published = []
        for s in plan.servers():  # each server's API port + 1000, bound on every address
            port = s.ports["http"] + 1000
            assert s.ports["kv_events"] == port, s.ports
            config = json.loads(s.argv[s.argv.index("--kv-events-config") + 1])
            assert config == {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://*:{port}",
            }
            published.append(f"{s.url}=tcp://{s.url.split('//')[1].rsplit(':', 1)[0]}:{port}")
        assert feeds == published and len(feeds) == 4
        assert p.argv[-2:] == ["--served-model", "/models/QwQ-32B"] and p.argv == p.proxy.argv()  # type: ignore[union-attr]
    for quiet in (["routing: kv", "kv_events: false"], ["routing: session"]):
        plan = plan_with(*quiet)
        assert "--kv-events" not in proxy_of(plan).argv and "--served-model" not in proxy_of(plan).argv
        assert all("--kv-events-config" not in s.argv and "kv_events" not in s.ports for s in plan.servers())


def test_a_set_events_port_counts_from_the_nodes_first_server() -> None:
    text = BASE.replace("\nproxy:\n", "\nproxy:\n  routing: kv\n", 1)
    text = text.replace("\ndecode:\n", "\ndecode:\n  kv_events_port: 9100\n", 1)
    assert "kv_events_port: 9100" in text
    ports = {s.name: s.ports["kv_events"] for s in build_plan(parse_topology(text)).servers()}
    assert ports == {"prefill-0": 8800, "prefill-1": 8801, "decode-0": 9100, "decode-1": 9101}


def test_dynamic_roles_reach_the_proxys_command_line() -> None:
    p = proxy_of(plan_with("roles: dynamic"))
    assert p.proxy is not None and p.proxy.roles == "dynamic"
    assert p.argv[-2:] == ["--roles", "dynamic"] and p.argv == p.proxy.argv()
    assert "--roles" not in proxy_of(plan_with("roles: fixed")).argv


def test_migrations_reach_the_proxys_command_line_and_a_bad_count_is_one_line() -> None:
    p = proxy_of(plan_with("migrations: 0"))
    assert p.proxy is not None and p.proxy.migrations == 0
    assert p.argv[-2:] == ["--migrations", "0"] and p.argv == p.proxy.argv()
    assert "--migrations" not in proxy_of(plan_with("migrations: 3")).argv  # the proxy's own default
    for bad in ("-1", "101", "two"):
        with pytest.raises(UcmctlError) as caught:
            plan_with(f"migrations: {bad}")
        assert "proxy.migrations" in str(caught.value), str(caught.value)


def test_the_stall_timeout_reaches_the_proxys_command_line_and_a_bad_one_is_one_line() -> None:
    p = proxy_of(plan_with("stall_timeout: 2.5"))
    assert p.proxy is not None and p.proxy.stall_timeout == 2.5
    assert p.argv[-2:] == ["--stall-timeout", "2.5"] and p.argv == p.proxy.argv()
    assert proxy_of(plan_with("stall_timeout: 0")).argv[-2:] == ["--stall-timeout", "0"]  # off
    assert "--stall-timeout" not in proxy_of(plan_with("stall_timeout: 30")).argv  # the proxy's default
    for bad in ("-1", "3601", "soon"):
        with pytest.raises(UcmctlError) as caught:
            plan_with(f"stall_timeout: {bad}")
        assert "proxy.stall_timeout" in str(caught.value), str(caught.value)


def test_replicas_on_one_node_take_consecutive_ports_and_spread_ones_a_port_each() -> None:
    plan = plan_with("replicas: 3")
    proxies = [p for p in plan.processes if p.role == "proxy"]
    assert [(p.name, p.node, p.ports["http"]) for p in proxies] == [
        ("proxy-0", "a", 7805), ("proxy-1", "a", 7806), ("proxy-2", "a", 7807)
    ]  # fmt: skip
    # each whole and alike: the same instances, routing and spec but its own port
    assert all(p.argv[p.argv.index("--port") + 1] == str(p.ports["http"]) for p in proxies)
    ports = {p.name: p.argv[p.argv.index("--port") + 1] for p in proxies}
    assert len({json.dumps([a for a in p.argv if a != ports[p.name]]) for p in proxies}) == 1
    assert plan.proxy_urls() == [p.url for p in proxies] and plan.proxy_words().startswith("proxies http://")
    from ucmctl.monitor.prometheus import targets

    scraped = [
        (t["labels"]["process"], t["targets"]) for t in targets(plan) if t["labels"]["role"] == "proxy"
    ]
    assert scraped == [(p.name, [f"192.168.10.1:{p.ports['http']}"]) for p in proxies]  # each replica
    text = BASE.replace("\nproxy:\n  node: a\n", "\nproxy:\n  nodes: [a, b]\n", 1)
    spread = build_plan(parse_topology(text))
    assert [(p.name, p.node, p.ports["http"]) for p in spread.processes if p.role == "proxy"] == [
        ("proxy-0", "a", 7805), ("proxy-1", "b", 7805)
    ]  # fmt: skip


def test_one_proxy_keeps_its_name_and_k8s_runs_replicas_as_one_deployment() -> None:
    from ucmctl.k8s.render import render_manifests

    assert [p.name for p in plan_with().processes if p.role == "proxy"] == ["proxy"]
    assert plan_with().proxy_words() == "proxy http://192.168.10.1:7805"
    objs = [m.obj for m in render_manifests(plan_with("replicas: 3"))]
    proxy = [o for o in objs if o["metadata"]["name"].endswith("-proxy")]
    (deployment,) = [o for o in proxy if o["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 3
    (service,) = [o for o in proxy if o["kind"] == "Service"]
    assert [p["port"] for p in service["spec"]["ports"]] == [7805]  # one front door: the base port
