"""The proxy's spec in the Plan: its argv made in one place, from the topology's routing,
the servers' block size and the direct threshold; render --k8s writes the same argv with the
pods' addresses."""

from __future__ import annotations

from tests.unit.plan.conftest import TOPOLOGIES
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
    p = proxy_of(plan_with("routing: kv", "direct_below: 256"))
    assert p.proxy is not None and p.proxy.routing == "kv" and p.proxy.direct_below == 256
    tail = p.argv[p.argv.index("--routing") :]
    assert tail == ["--routing", "kv", "--direct-below", "256"]  # the example sets no block size
    assert p.proxy.block_size is None
    assert p.argv == p.proxy.argv()
    assert proxy_of(plan_with("routing: prefix")).argv[-2:] == ["--routing", "affinity"]


def test_dynamic_roles_reach_the_proxys_command_line() -> None:
    p = proxy_of(plan_with("roles: dynamic"))
    assert p.proxy is not None and p.proxy.roles == "dynamic"
    assert p.argv[-2:] == ["--roles", "dynamic"] and p.argv == p.proxy.argv()
    assert "--roles" not in proxy_of(plan_with("roles: fixed")).argv
