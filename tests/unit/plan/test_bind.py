"""Every listener binds the address the topology gives, never every interface unless asked."""

from __future__ import annotations

import pytest

from ucmctl.core.errors import UcmctlError
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan, Process
from ucmctl.topology.load import parse_topology

P2P = """
name: bind
mode: p2p
engine: {engine}
model: {{path: /models/m}}
nodes:
  a: {{host: 10.0.0.1, platform: cuda{a}}}
  b: {{host: node-b.example, platform: cuda{b}}}
mooncake: {{master_node: a}}
prefill: {{nodes: [a]}}
decode: {{nodes: [b]}}
proxy: {{node: a{proxy}}}
"""


def _plan(engine: str = "vllm", a: str = "", b: str = "", proxy: str = "") -> Plan:
    return build_plan(parse_topology(P2P.format(engine=engine, a=a, b=b, proxy=proxy)))


def _value(p: Process, flag: str) -> str:
    return p.argv[p.argv.index(flag) + 1]


def _listen_addresses(plan: Plan) -> dict[str, list[str]]:
    """Every address a process is told to bind, by process name."""
    flags = ("--host", "--rpc_address", "--metrics_host")
    return {p.name: [_value(p, f) for f in flags if f in p.argv] for p in plan.processes}


@pytest.mark.parametrize("engine", ["vllm", "sim"])
def test_listeners_bind_the_node_address_by_default(engine: str) -> None:
    plan = _plan(engine)
    assert _listen_addresses(plan) == {
        "mooncake-master": ["10.0.0.1", "10.0.0.1"],
        "prefill-0": ["10.0.0.1"],
        "decode-0": ["node-b.example"],
        "proxy": ["10.0.0.1"],
    }
    master = plan.process("mooncake-master")
    assert (
        "--http_metadata_server_host" not in master.argv
        and "--enable_http_metadata_server" not in master.argv
    )


def test_every_interface_only_when_the_topology_asks() -> None:
    plan = _plan(a=", bind: 0.0.0.0", b=", bind: '10.9.0.2'")
    assert _listen_addresses(plan) == {
        "mooncake-master": ["0.0.0.0", "0.0.0.0"],
        "prefill-0": ["0.0.0.0"],
        "decode-0": ["10.9.0.2"],
        "proxy": ["0.0.0.0"],
    }
    # a named address is the only one that answers: health checks and the proxy go there
    assert plan.process("decode-0").health[0] == "http://10.9.0.2:8000/health"
    assert "http://10.9.0.2:8000" in plan.process("proxy").argv
    # every interface: reached at the node's host
    assert plan.process("prefill-0").health[0].startswith("http://10.0.0.1:")


def test_proxy_host_overrides_the_node_bind() -> None:
    plan = _plan(a=", bind: 0.0.0.0", proxy=", host: '::1'")
    assert _value(plan.process("proxy"), "--host") == "::1"
    assert _value(plan.process("prefill-0"), "--host") == "0.0.0.0"


def test_local_node_binds_loopback() -> None:
    topology = parse_topology(
        """
name: local
mode: mixed
model: {path: /models/m}
nodes:
  me: {host: localhost, transport: local, platform: cpu}
mixed: {nodes: [me]}
proxy: {node: me, port: 7900}
"""
    )
    plan = build_plan(topology)
    assert _listen_addresses(plan) == {"mixed-0": ["127.0.0.1"], "proxy": ["127.0.0.1"]}


@pytest.mark.parametrize("bind", ["node-a", "10.0.0.256", "0.0.0.0 --x", "''"])
def test_bind_must_be_an_ip_address(bind: str) -> None:
    with pytest.raises(UcmctlError) as caught:
        _plan(a=f", bind: {bind}")
    (problem,) = [p.render() for p in caught.value.problems]
    assert "nodes.a.bind: must be an IP address of the node" in problem
