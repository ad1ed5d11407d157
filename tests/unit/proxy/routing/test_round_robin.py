"""`round-robin`: each instance in turn whatever its load, unhealthy ones skipped."""

from __future__ import annotations

from tests.unit.proxy.routing.helpers import pick, pool_of, port
from ucmctl.proxy.routing.round_robin import RoundRobin


def test_each_instance_in_turn_whatever_its_load() -> None:
    rr, pool = RoundRobin(), pool_of("decode", 3)
    pool.by_role["decode"][0].acquire(10_000)  # the busiest still gets its turn
    picks = [port(pick(rr, pool, "decode", "requests").url) for _ in range(6)]  # type: ignore[union-attr]
    assert picks == [8000, 8001, 8002, 8000, 8001, 8002]


def test_roles_turn_apart_and_unhealthy_is_skipped() -> None:
    rr = RoundRobin()
    pool = pool_of("prefill", 2, pool_of("decode", 3))
    pool.by_role["decode"][1].healthy = False
    decode = [port(pick(rr, pool, "decode", "requests").url) for _ in range(4)]  # type: ignore[union-attr]
    prefill = [port(pick(rr, pool, "prefill", "tokens").url) for _ in range(3)]  # type: ignore[union-attr]
    assert decode == [8000, 8002, 8000, 8002]
    assert prefill == [8000, 8001, 8000]


def test_dynamic_roles_make_every_pd_instance_a_candidate_of_either_leg() -> None:
    from ucmctl.proxy.pool import Pool

    pool = pool_of("prefill", 1, pool_of("decode", 2, Pool(dynamic=True)))
    assert len(pool.candidates("prefill")) == len(pool.candidates("decode")) == 3
    pool.by_role["decode"][0].draining = True
    assert len(pool.candidates("prefill")) == 2
    fixed = pool_of("prefill", 1, pool_of("decode", 2))
    assert [i.role for i in fixed.candidates("prefill")] == ["prefill"]
