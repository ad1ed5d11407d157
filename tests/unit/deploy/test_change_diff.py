"""What an `up` of an edited topology of a running deployment would do (deploy/change.py): only
what the topology adds is started, only what it drops is stopped, a server whose command line
changed is restarted; what cannot change while it runs is refused with the way out."""

from __future__ import annotations

import pytest

from tests.unit.deploy.test_scale_plan import SIM
from ucmctl.core.errors import UcmctlError
from ucmctl.deploy.change import diff
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan
from ucmctl.topology.load import parse_topology


def _plan(text: str) -> Plan:
    return build_plan(parse_topology(text, name="t.yaml"))


def test_the_same_topology_changes_nothing() -> None:
    assert diff(_plan(SIM), _plan(SIM), restart_changed=True, how="this topology").empty


def test_a_new_node_adds_its_servers_and_the_proxy_is_only_restaged() -> None:
    new = SIM.replace(
        "  b: {host: 10.0.0.2, platform: cpu, devices: 0}\n",
        "  b: {host: 10.0.0.2, platform: cpu, devices: 0}\n  c: {host: 10.0.0.3, platform: cpu}\n",
    )
    new = new.replace("decode: {nodes: [a, b]", "decode: {nodes: [a, b, c]")  # fmt: skip
    d = diff(_plan(SIM), _plan(new), restart_changed=True, how="this topology")
    assert [(p.name, p.node) for p in d.added] == [("decode-2", "c")]
    assert d.removed == [] and d.changed == []
    ((was, now),) = d.restaged
    assert was.name == now.name == "proxy" and "http://10.0.0.3:8100" in " ".join(now.argv)


def test_a_changed_flag_restarts_those_servers_and_a_dropped_node_takes_its_out() -> None:
    old = SIM.replace(
        "decode: {nodes: [a, b], port: 8100}", "decode: {nodes: [a, b], port: 8100, servers_per_node: 2}"
    )
    new = old.replace(
        "decode: {nodes: [a, b], port: 8100,", "decode: {nodes: [a], port: 8100, flags: {decode-step-ms: 9},"
    )
    d = diff(_plan(old), _plan(new), restart_changed=True, how="this topology")
    assert [(p.name, p.node) for p in d.removed] == [("decode-2", "b"), ("decode-3", "b")] and d.added == []
    assert [was.name for was, _ in d.changed] == ["decode-0", "decode-1"]
    assert all(now.argv[now.argv.index("--decode-step-ms") + 1] == "9" for _, now in d.changed)
    with pytest.raises(UcmctlError) as caught:  # scale never restarts
        diff(_plan(old), _plan(new), restart_changed=False, how="this scale")
    assert "this scale would change decode-0" in str(caught.value)


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("proxy: {node: a, port: 8002}", "proxy: {node: a, port: 8003}", "changes the proxy's replicas"),
        ("proxy: {node: a, port: 8002}", "proxy: {node: b, port: 8002}", "changes the proxy's replicas"),
        ("proxy: {node: a, port: 8002}", "proxy: {node: a, port: 8002, replicas: 2}", "changes the proxy's"),
        ("mode: centralized", "mode: mixed", "changes the deployment's mode or engine"),
    ],
)
def test_what_cannot_change_while_it_runs_is_refused(old: str, new: str, said: str) -> None:
    changed = SIM.replace(old, new)
    if "mixed" in new:
        changed = changed.replace("prefill: {nodes: [a], port: 8000}\n", "").replace("decode:", "mixed:")
    with pytest.raises(UcmctlError) as caught:
        diff(_plan(SIM), _plan(changed), restart_changed=True, how="this topology")
    assert said in str(caught.value) and "ucmctl down s" in str(caught.value), str(caught.value)


def test_a_change_of_the_only_instance_of_a_role_is_refused() -> None:
    one = SIM.replace("decode: {nodes: [a, b], port: 8100}", "decode: {nodes: [a], port: 8100}")
    flagged = one.replace(
        "decode: {nodes: [a], port: 8100}", "decode: {nodes: [a], port: 8100, flags: {x: 1}}"
    )
    with pytest.raises(UcmctlError) as caught:
        diff(_plan(one), _plan(flagged), restart_changed=True, how="this topology")
    assert "this topology changes decode-0, the only decode instance" in str(caught.value)
    assert "`ucmctl scale`), or `ucmctl down s` and `up`" in str(caught.value), str(caught.value)


TWO = SIM.replace("prefill: {nodes: [a], port: 8000}", "prefill: {nodes: [a, b], port: 8000}")


def test_a_server_taking_a_port_another_frees_restarts_after_it() -> None:
    new = TWO.replace("port: 8100}", "port: 8200}").replace("port: 8000}", "port: 8100}")
    d = diff(_plan(TWO), _plan(new), restart_changed=True, how="this topology")
    order = [(now.name, now.node, now.ports["http"]) for _, now in d.changed]
    # prefill-0 takes a's 8100, which decode-0 holds until it has restarted on 8200
    assert order == [
        ("decode-0", "a", 8200),
        ("prefill-0", "a", 8100),
        ("decode-1", "b", 8200),
        ("prefill-1", "b", 8100),
    ]


def test_a_swap_of_ports_is_refused_before_anything_restarts() -> None:
    new = (
        TWO.replace("port: 8100}", "port: 7000}")
        .replace("port: 8000}", "port: 8100}")
        .replace("7000", "8000")
    )
    with pytest.raises(UcmctlError) as caught:
        diff(_plan(TWO), _plan(new), restart_changed=True, how="this topology")
    said = str(caught.value)
    assert (
        "this topology gives decode-0 port 8000 on node a, which prefill-0 holds, and prefill-0 takes" in said
    ), said
    assert "move one of them to a free port first" in said
