"""Routing: least loaded first, ties round-robin, unhealthy skipped, prefix affinity while healthy."""

from __future__ import annotations

from collections import Counter

from ucmctl.proxy.balancer import Pool


def pool_of(role: str, n: int) -> Pool:
    pool = Pool()
    for i in range(n):
        pool.add(f"http://127.0.0.1:{8000 + i}", role)
    return pool


def port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_ties_are_round_robin() -> None:
    pool = pool_of("decode", 3)
    picks = [port(pool.pick("decode", "requests").url) for _ in range(6)]  # type: ignore[union-attr]
    assert picks == [8000, 8001, 8002, 8000, 8001, 8002]


def test_prefill_goes_to_fewest_tokens_in_flight() -> None:
    pool = pool_of("prefill", 3)
    a, b, c = pool.by_role["prefill"]
    a.acquire(5000)  # one long prompt
    b.acquire(100)
    b.acquire(100)  # two short ones: more requests, fewer tokens
    assert pool.pick("prefill", "tokens") is c
    c.acquire(300)
    assert pool.pick("prefill", "tokens") is b


def test_decode_goes_to_fewest_requests_in_flight() -> None:
    pool = pool_of("decode", 2)
    a, b = pool.by_role["decode"]
    a.acquire(10)
    b.acquire(10_000)
    b.acquire(10)
    assert pool.pick("decode", "requests") is a


def test_load_spreads_when_requests_stay_in_flight() -> None:
    pool = pool_of("decode", 4)
    for _ in range(40):
        pool.pick("decode", "requests").acquire(1)  # type: ignore[union-attr]
    assert [i.requests for i in pool.by_role["decode"]] == [10, 10, 10, 10]


def test_release_restores_counts() -> None:
    pool = pool_of("prefill", 1)
    (a,) = pool.by_role["prefill"]
    a.acquire(7)
    a.release(7)
    assert (a.requests, a.tokens, a.requests_total) == (0, 0, 1)


def test_unhealthy_and_excluded_are_skipped() -> None:
    pool = pool_of("decode", 3)
    a, b, c = pool.by_role["decode"]
    b.healthy = False
    picks = {pool.pick("decode", "requests", exclude=[a]).url for _ in range(5)}  # type: ignore[union-attr]
    assert picks == {c.url}
    c.healthy = False
    assert pool.pick("decode", "requests", exclude=[a]) is None
    assert pool.pick("mixed", "requests") is None  # no instance of that role at all


def test_prefix_affinity_sticks_while_healthy_then_moves() -> None:
    pool = pool_of("prefill", 3)
    first = pool.pick("prefill", "tokens", affinity_key=b"k1")
    assert first is not None
    first.acquire(10_000)  # even when it is now the busiest one
    assert all(pool.pick("prefill", "tokens", affinity_key=b"k1") is first for _ in range(5))
    other = pool.pick("prefill", "tokens", affinity_key=b"k2")
    assert other is not first  # a new prefix goes by load
    first.healthy = False
    moved = pool.pick("prefill", "tokens", affinity_key=b"k1")
    assert moved is not None and moved is not first
    first.healthy = True
    assert pool.pick("prefill", "tokens", affinity_key=b"k1") is moved  # it stays where its KV now is


def test_affinity_table_is_bounded() -> None:
    pool = Pool(affinity_entries=4)
    pool.add("http://127.0.0.1:8000", "prefill")
    for i in range(10):
        pool.pick("prefill", "tokens", affinity_key=b"%d" % i)
    assert len(pool._affinity) == 4


def test_affinity_spreads_distinct_prefixes() -> None:
    pool = pool_of("prefill", 4)
    counts: Counter[str] = Counter()
    for i in range(400):
        inst = pool.pick("prefill", "tokens", affinity_key=b"p%d" % (i % 40))
        assert inst is not None
        counts[inst.url] += 1
    assert sorted(counts.values()) == [100, 100, 100, 100]


def test_add_and_remove() -> None:
    pool = pool_of("decode", 2)
    assert pool.add("http://127.0.0.1:8000", "decode") is None  # already there
    assert pool.add("http://127.0.0.1:8000", "prefill") is not None  # same URL, other role
    sticky = pool.pick("prefill", "tokens", affinity_key=b"x")
    gone = pool.remove("http://127.0.0.1:8000", "decode")
    assert len(gone) == 1 and gone[0].removed
    assert [i.url for i in pool.by_role["decode"]] == ["http://127.0.0.1:8001"]
    assert pool.remove("http://127.0.0.1:8000") == [sticky]
    assert pool._affinity == {}  # no route left to a removed instance
    assert pool.remove("http://127.0.0.1:9999") == []
    assert pool.healthy("decode") == 1
