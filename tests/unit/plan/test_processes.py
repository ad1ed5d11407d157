"""A process's node-side facts: the address others reach, the address it binds, its tools."""

from __future__ import annotations

from ucmctl.plan.processes import LOCAL_ADDRESS, bind_address, python_of, reach_address, tool_path
from ucmctl.topology.load import parse_topology
from ucmctl.topology.model import Node

TOPOLOGY = """
name: processes
mode: mixed
model: {path: /models/m}
nodes:
  a: {host: 10.0.0.1, platform: cuda, bind: 0.0.0.0, venv: /opt/venv}
  b: {host: node-b.example, platform: cuda, python: /usr/local/bin/python3}
  c: {host: 127.0.0.1, transport: local, platform: cuda}
mixed: {nodes: [a, b, c]}
proxy: {node: a}
"""


def _nodes() -> dict[str, Node]:
    return parse_topology(TOPOLOGY).nodes


def test_an_unspecified_bind_is_reached_at_the_host() -> None:
    a = _nodes()["a"]
    assert bind_address(a) == "0.0.0.0"
    assert reach_address(a) == "10.0.0.1"


def test_without_bind_a_node_binds_where_it_is_reached() -> None:
    b, c = _nodes()["b"], _nodes()["c"]
    assert (bind_address(b), reach_address(b)) == ("node-b.example", "node-b.example")
    assert (bind_address(c), reach_address(c)) == (LOCAL_ADDRESS, LOCAL_ADDRESS)


def test_tools_sit_next_to_the_nodes_python() -> None:
    a, b = _nodes()["a"], _nodes()["b"]
    assert python_of(a) == "/opt/venv/bin/python"
    assert tool_path(a, "vllm") == "/opt/venv/bin/vllm"
    assert tool_path(b, "vllm") == "/usr/local/bin/vllm"
