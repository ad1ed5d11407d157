"""A side's servers as a LeaderWorkerSet (k8s/layout.py): instances, pods per instance,
containers per pod, and where each of the Plan's servers lands."""

from __future__ import annotations

from pathlib import Path

import pytest

from ucmctl.core.errors import UcmctlError
from ucmctl.k8s.layout import side_layout
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan, Process
from ucmctl.topology.load import load_topology

TOPOLOGIES = Path(__file__).resolve().parents[3] / "topologies"


def _plan(name: str) -> Plan:
    return build_plan(load_topology(TOPOLOGIES / f"{name}.yaml"))


def _side(plan: Plan, role: str) -> list[Process]:
    return [p for p in plan.servers() if p.role == role]


def test_an_instance_of_one_server_is_one_pod_of_one_container() -> None:
    plan = _plan("1p1d")
    (prefill,) = _side(plan, "prefill")
    s = side_layout(plan, "base", "prefill", [prefill])
    assert (s.name, s.replicas, s.size, s.per_pod, s.external_dp) == ("base-prefill", 1, 1, 1, False)
    assert s.templates == [prefill]
    assert s.where == {prefill.name: (0, 0, 0)}
    assert s.pod_host("ns", 0, 0) == "base-prefill-0.base-prefill.ns"
    assert s.pod_host("ns", 2, 1) == "base-prefill-2-1.base-prefill.ns"


def test_external_dp_groups_are_instances_and_a_node_s_ranks_share_a_pod() -> None:
    plan = _plan("ep-dp4tp8-dp8tp4")
    decode = _side(plan, "decode")  # DP8 over 4 nodes, 2 ranks on each
    s = side_layout(plan, "ep", "decode", decode)
    assert (s.replicas, s.size, s.per_pod, s.external_dp) == (1, 4, 2, True)
    assert s.templates == decode[:2]
    assert [s.where[p.name] for p in decode] == [(0, r // 2, r % 2) for r in range(8)]
    prefill = _side(plan, "prefill")  # DP4 over 4 nodes, a rank each
    p = side_layout(plan, "ep", "prefill", prefill)
    assert (p.replicas, p.size, p.per_pod) == (1, 4, 1)


def test_a_side_over_two_platforms_is_refused() -> None:
    plan = _plan("hetero-ascend-cuda")
    servers = list(plan.servers())
    platforms = {plan.nodes[p.node].platform for p in servers}
    assert len(platforms) > 1
    with pytest.raises(UcmctlError, match="cannot share one pod template"):
        side_layout(plan, "h", "prefill", servers)


def test_uneven_ranks_per_node_are_refused() -> None:
    plan = _plan("ep-dp4tp8-dp8tp4")
    decode = _side(plan, "decode")
    # the third rank moved to the first node: 3, 1, 2, 2 ranks per node
    moved = [*decode[:2], decode[2].model_copy(update={"node": decode[0].node}), *decode[3:]]
    with pytest.raises(UcmctlError, match="the same number of DP ranks on every node"):
        side_layout(plan, "ep", "decode", moved)
