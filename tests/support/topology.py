"""Topology files for tests of real deployments: the node lines of test hosts, a one-server
simulator deployment, a file in the test's folder."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.netns import Cluster


def node_lines(c: Cluster, names: list[str], platform: str = "cpu") -> str:
    return "\n".join(
        f"  {n}: {{host: {c.host(n).address}, key: {c.key}, platform: {platform}, python: {sys.executable}}}"
        for n in names
    )


def mixed_sim(name: str, nodes: str, on: str, port: int) -> str:
    """A one-server mixed deployment of the simulator on node `on`; `nodes` as node_lines gives."""
    return f"""
name: {name}
mode: mixed
engine: sim
model: {{path: sim-model}}
nodes:
{nodes}
mixed: {{nodes: [{on}], port: {port}}}
"""


def write(tmp: Path, text: str) -> Path:
    """A topology file in the test's folder."""
    path = tmp / "topology.yaml"
    path.write_text(text)
    return path
