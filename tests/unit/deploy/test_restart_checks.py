"""What `ucmctl restart` and `scale` check before they touch anything: the processes named, and
that every node still answers (a Slurm job that is gone: exit 3, nothing changed)."""

from __future__ import annotations

from typing import Any

import pytest

from ucmctl.core.errors import ExitStatus, UcmctlError
from ucmctl.deploy.restart import chosen, reach
from ucmctl.deploy.state import Record
from ucmctl.nodes.executor import NodeError
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import parse_topology

TOPOLOGY = """
name: r
mode: centralized
engine: sim
model: {path: sim-model}
nodes:
  a: {host: 10.0.0.1, platform: cpu, devices: 0}
storage: {storage_backends: /shared/kv}
prefill: {nodes: [a], port: 8000, servers_per_node: 2}
decode: {nodes: [a], port: 8100}
proxy: {node: a, port: 8002}
"""


def _record() -> Record:
    t = parse_topology(TOPOLOGY)
    return Record(deployment="r", topology_path="t.yaml", topology_digest=t.digest(), plan=build_plan(t))


def test_no_name_means_every_api_server_and_names_are_checked() -> None:
    record = _record()
    assert [p.name for p in chosen(record, [])] == ["prefill-0", "prefill-1", "decode-0"]
    assert [p.name for p in chosen(record, ["decode-0", "proxy", "decode-0"])] == ["decode-0", "proxy"]
    with pytest.raises(UcmctlError) as caught:
        chosen(record, ["decode-7"])
    assert caught.value.status == ExitStatus.BAD_INPUT
    assert "deployment 'r' has no process 'decode-7'" in str(caught.value)


class _GoneJob:
    """A launcher whose Slurm job was cancelled: every node is unreachable."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def alive(self, p: Any) -> int | None:
        self.asked.append(p.name)
        raise NodeError(p.node, "no Slurm job named ucmctl-r runs")


def test_a_node_that_does_not_answer_stops_everything_before_it_starts() -> None:
    launcher = _GoneJob()
    with pytest.raises(UcmctlError) as caught:
        reach(launcher, chosen(_record(), []))  # type: ignore[arg-type]
    assert caught.value.status == ExitStatus.NOT_READY
    assert str(caught.value) == (
        "prefill-0: node a: no Slurm job named ucmctl-r runs; nothing was changed (see `ucmctl status`)"
    )
    assert launcher.asked == ["prefill-0"]
