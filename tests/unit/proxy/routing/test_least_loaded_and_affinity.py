"""`least-loaded`: least loaded first, ties round-robin, unhealthy skipped; `affinity`: the same
leading block to the same instance while it is a candidate."""

from __future__ import annotations

from collections import Counter

from tests.unit.proxy.routing.helpers import pick, pool_of, port
from ucmctl.proxy.routing.affinity import Affinity
from ucmctl.proxy.routing.least_loaded import LeastLoaded


def test_ties_are_round_robin() -> None:
    ll = LeastLoaded()
    pool = pool_of("decode", 3)
    picks = [port(pick(ll, pool, "decode", "requests").url) for _ in range(6)]  # type: ignore[union-attr]
    assert picks == [8000, 8001, 8002, 8000, 8001, 8002]


def test_prefill_goes_to_fewest_tokens_in_flight() -> None:
    ll = LeastLoaded()
    pool = pool_of("prefill", 3)
    a, b, c = pool.by_role["prefill"]
    a.acquire(5000)  # one long prompt
    b.acquire(100)
    b.acquire(100)  # two short ones: more requests, fewer tokens
    assert pick(ll, pool, "prefill", "tokens") is c
    c.acquire(300)
    assert pick(ll, pool, "prefill", "tokens") is b


def test_decode_goes_to_fewest_requests_in_flight() -> None:
    ll = LeastLoaded()
    pool = pool_of("decode", 2)
    a, b = pool.by_role["decode"]
    a.acquire(10)
    b.acquire(10_000)
    b.acquire(10)
    assert pick(ll, pool, "decode", "requests") is a


def test_load_spreads_when_requests_stay_in_flight() -> None:
    ll = LeastLoaded()
    pool = pool_of("decode", 4)
    for _ in range(40):
        pick(ll, pool, "decode", "requests").acquire(1)  # type: ignore[union-attr]
    assert [i.requests for i in pool.by_role["decode"]] == [10, 10, 10, 10]


def test_waiting_counts_the_prompts_not_answered_yet() -> None:
    pool = pool_of("prefill", 1)
    (a,) = pool.by_role["prefill"]
    a.acquire(100)
    a.acquire(50)
    assert (a.tokens, a.waiting) == (150, 150)
    a.answered(100)  # its first bytes came: its prompt is computed
    assert (a.tokens, a.waiting) == (150, 50)
    a.release(100)
    a.release(50, answered=False)  # failed before it answered
    assert (a.requests, a.tokens, a.waiting) == (0, 0, 0)


def test_release_restores_counts() -> None:
    pool = pool_of("prefill", 1)
    (a,) = pool.by_role["prefill"]
    a.acquire(7)
    a.release(7)
    assert (a.requests, a.tokens, a.requests_total) == (0, 0, 1)


def test_unhealthy_and_excluded_are_skipped() -> None:
    ll = LeastLoaded()
    pool = pool_of("decode", 3)
    a, b, c = pool.by_role["decode"]
    b.healthy = False
    picks = {pick(ll, pool, "decode", "requests", exclude=[a]).url for _ in range(5)}  # type: ignore[union-attr]
    assert picks == {c.url}
    c.healthy = False
    assert pick(ll, pool, "decode", "requests", exclude=[a]) is None
    assert pick(ll, pool, "mixed", "requests") is None  # no instance of that role at all


def test_prefix_affinity_sticks_while_healthy_then_moves() -> None:
    aff = Affinity()
    pool = pool_of("prefill", 3)
    first = pick(aff, pool, "prefill", "tokens", prefix=b"k1")
    assert first is not None
    first.acquire(10_000)  # even when it is now the busiest one
    assert all(pick(aff, pool, "prefill", "tokens", prefix=b"k1") is first for _ in range(5))
    other = pick(aff, pool, "prefill", "tokens", prefix=b"k2")
    assert other is not first  # a new prefix goes by load
    first.healthy = False
    moved = pick(aff, pool, "prefill", "tokens", prefix=b"k1")
    assert moved is not None and moved is not first
    first.healthy = True
    assert pick(aff, pool, "prefill", "tokens", prefix=b"k1") is moved  # it stays where its KV now is


def test_affinity_table_is_bounded() -> None:
    aff = Affinity(entries=4)
    pool = pool_of("prefill", 1)
    for i in range(10):
        pick(aff, pool, "prefill", "tokens", prefix=b"%d" % i)
    assert len(aff) == 4


def test_affinity_spreads_distinct_prefixes() -> None:
    aff = Affinity()
    pool = pool_of("prefill", 4)
    counts: Counter[str] = Counter()
    for i in range(400):
        inst = pick(aff, pool, "prefill", "tokens", prefix=b"p%d" % (i % 40))
        assert inst is not None
        counts[inst.url] += 1
    assert sorted(counts.values()) == [100, 100, 100, 100]


def test_add_and_remove() -> None:
    aff = Affinity()
    pool = pool_of("decode", 2)
    assert pool.add("http://127.0.0.1:8000", "decode") is None  # already there
    assert pool.add("http://127.0.0.1:8000", "prefill") is not None  # same URL, other role
    sticky = pick(aff, pool, "prefill", "tokens", prefix=b"x")
    gone = pool.remove("http://127.0.0.1:8000", "decode")
    assert len(gone) == 1 and gone[0].removed
    assert [i.url for i in pool.by_role["decode"]] == ["http://127.0.0.1:8001"]
    gone = pool.remove("http://127.0.0.1:8000")
    assert gone == [sticky]
    assert len(aff) == 1
    aff.forget(gone)
    assert len(aff) == 0  # no route left to a removed instance
    assert pool.remove("http://127.0.0.1:9999") == []
    assert pool.healthy("decode") == 1
