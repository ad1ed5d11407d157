"""The checks of the servers as placed (topology/placement_checks.py), on topologies that pass
every other check: a node's devices, the cores vLLM CPU servers bind, the ports of a node."""

from __future__ import annotations

from typing import Any

import yaml

from ucmctl.topology.model import Topology
from ucmctl.topology.placement_checks import check_placement

HEAD = "name: p\nmode: centralized\nmodel: {path: /m}\nnodes:\n"


def _found(text: str) -> list[tuple[Any, str]]:
    found: list[tuple[Any, str]] = []
    topology = Topology.model_validate(yaml.safe_load(HEAD + text))
    check_placement(topology, lambda path, message, fix=None: found.append((path, message)))
    return found


def test_a_node_with_too_few_devices_and_a_port_used_twice() -> None:
    assert _found("""
  a: {host: 10.0.0.1, platform: cuda, devices: 1}
prefill: {nodes: [a], port: 8000}
decode: {nodes: [a], port: 8001}
proxy: {node: a, port: 8000}
""") == [
        (("nodes", "a", "devices"),
         "node 'a' has 1 devices but its servers need 2 (prefill 1 x 1 + decode 1 x 1)"),
        (("proxy", "port"), "port 8000 on node 'a' is used by both prefill-0 API and proxy"),
    ]  # fmt: skip


def test_vllm_cpu_servers_on_one_node_need_their_own_cores() -> None:
    lines = """
  a: {host: 10.0.0.1, platform: cpu, devices: 0}
prefill: {nodes: [a], port: 8000%s}
decode: {nodes: [a], port: 8001, env: {VLLM_CPU_OMP_THREADS_BIND: "1"}}
proxy: {node: a, port: 9000}
"""
    assert _found(lines % "") == [
        (("prefill", "env", "VLLM_CPU_OMP_THREADS_BIND"),
         "node 'a' runs 2 vLLM CPU servers and vLLM binds each to the same cores unless "
         "VLLM_CPU_OMP_THREADS_BIND gives each its own"),
    ]  # fmt: skip
    assert _found(lines % ', env: {VLLM_CPU_OMP_THREADS_BIND: "0"}') == []
