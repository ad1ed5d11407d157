"""What deploy reads from the Plan instead of guessing from the topology or from strings: each
process's role, stage and health timeout, each node's bind, and the store."""

from __future__ import annotations

from ucmctl.deploy.api import Options, _health_timeout
from ucmctl.plan.model import SERVER_ROLES, Plan, Stage


def test_roles_stages_and_health_timeouts(plans: dict[str, Plan]) -> None:
    for plan in plans.values():
        for p in plan.processes:
            expected_stage = {"mooncake": Stage.mooncake, "proxy": Stage.proxy}.get(p.role, Stage.servers)
            assert p.stage is expected_stage
            assert p.is_server == (p.role in SERVER_ROLES)
            if p.is_server:
                assert p.health_timeout == (60.0 if plan.engine == "sim" else 900.0)
            else:
                assert p.health_timeout == 60.0
            assert _health_timeout(p, Options()) == p.health_timeout
            assert _health_timeout(p, Options(health_timeout=5.0)) == 5.0  # --health-timeout wins


def test_store_users_are_the_servers_with_a_ucm_config(plans: dict[str, Plan]) -> None:
    p2p = plans["2p2d-p2p"]
    assert p2p.store is not None
    assert [p.role for p in p2p.processes if p2p.uses_store(p)] == ["prefill", "prefill"]  # decode: Mooncake
    centralized = plans["2p2d-centralized"]
    assert {p.role for p in centralized.processes if centralized.uses_store(p)} == {"prefill", "decode"}
    assert centralized.store is not None and centralized.store.tiers == ["Cache", "Posix"]


def test_each_node_says_what_its_listeners_bind(plans: dict[str, Plan]) -> None:
    local = plans["local-1p1d"]
    assert {n.bind for n in local.nodes.values()} == {"127.0.0.1"}
    for plan in plans.values():
        for p in plan.servers():
            argv = p.argv
            assert argv[argv.index("--host") + 1] == plan.nodes[p.node].bind
