"""`ucmctl scale` planned: the side's count changes on its last node, every process that stays
is the same process (name, ports, devices, files), and a scale that would change one is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from ucmctl.core.errors import UcmctlError
from ucmctl.deploy.change import Diff, diff
from ucmctl.deploy.scale import scaled_topology
from ucmctl.deploy.state import Record
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan, Process
from ucmctl.topology.load import load_topology

SIM = """
name: s
mode: centralized
engine: sim
model: {path: sim-model}
nodes:
  a: {host: 10.0.0.1, platform: cpu, devices: 0}
  b: {host: 10.0.0.2, platform: cpu, devices: 0}
storage: {storage_backends: /shared/kv}
prefill: {nodes: [a], port: 8000}
decode: {nodes: [a, b], port: 8100}
proxy: {node: a, port: 8002}
"""
GPU = """
name: g
mode: centralized
model: {path: /models/m}
nodes:
  a: {host: 10.0.0.1, platform: cuda, devices: 8}
storage: {storage_backends: /shared/kv}
prefill: {nodes: [a], port: 8000, tp: 2}
decode: {nodes: [a], port: 8100, tp: 2}
proxy: {node: a, port: 8002}
"""


def _record(tmp: Path, text: str) -> Record:
    path = tmp / "t.yaml"
    path.write_text(text)
    topology = load_topology(path)
    return Record(deployment=topology.name, topology_path=str(path), topology_digest=topology.digest(),
                  plan=build_plan(topology), status="up")  # fmt: skip


def _diff(old: Plan, new: Plan) -> tuple[list[Process], list[Process]]:
    d: Diff = diff(old, new, restart_changed=False, how="this scale")
    assert d.changed == [] and [was.name for was, _ in d.restaged] in ([], ["proxy"])
    return d.added, d.removed


def test_decode_grows_and_shrinks_on_its_last_node_and_the_rest_stays_the_same(tmp_path: Path) -> None:
    record = _record(tmp_path, SIM)
    grown = build_plan(scaled_topology(record, {"decode": 4}))
    added, removed = _diff(record.plan, grown)
    assert [(p.name, p.node, p.ports["http"]) for p in added] == [
        ("decode-2", "b", 8101),
        ("decode-3", "b", 8102),
    ]
    assert removed == []
    assert (
        "--decoder" in grown.process("proxy").argv and "http://10.0.0.2:8102" in grown.process("proxy").argv
    )
    record.plan = grown
    shrunk = build_plan(scaled_topology(record, {"decode": 2}))
    added, removed = _diff(grown, shrunk)
    assert added == [] and [p.name for p in removed] == ["decode-2", "decode-3"]
    assert shrunk.process("decode-1") == grown.process("decode-1")


def test_counts_it_cannot_take_are_refused(tmp_path: Path) -> None:
    record = _record(tmp_path, SIM)
    for counts, said in (
        ({"decode": 0}, "--decode 0: a side keeps at least 1 instance"),
        ({"decode": 1}, "taken out of the side's last node, b, and it keeps one at least (ask for 2 or more"),
        ({"mixed": 2}, "deployment 's' has no mixed side"),
    ):
        with pytest.raises(UcmctlError) as caught:
            scaled_topology(record, counts)
        assert said in str(caught.value)


def test_a_scale_that_moves_another_servers_devices_is_refused(tmp_path: Path) -> None:
    record = _record(tmp_path, GPU)
    with pytest.raises(UcmctlError) as caught:  # prefill-1 takes cards 2-3: decode-0's
        _diff(record.plan, build_plan(scaled_topology(record, {"prefill": 2})))
    assert "this scale would change decode-0" in str(caught.value)
    added, _ = _diff(record.plan, build_plan(scaled_topology(record, {"decode": 2})))
    assert [(p.name, p.devices) for p in added] == [("decode-1", [4, 5])]


def test_a_changed_topology_file_is_refused(tmp_path: Path) -> None:
    record = _record(tmp_path, SIM)
    Path(record.topology_path).write_text(SIM.replace("port: 8002", "port: 8003"))
    with pytest.raises(UcmctlError) as caught:
        scaled_topology(record, {"decode": 3})
    assert "changed since `up` of 's'" in str(caught.value)
