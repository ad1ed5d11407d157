"""`session`: a conversation stays on one instance while that keeps within the load bound; keys
spread over the instances; an instance that leaves moves only its own conversations."""

from __future__ import annotations

from collections import Counter

from tests.unit.proxy.routing.helpers import pick, pool_of
from ucmctl.proxy.routing.session import Session


def test_a_conversation_stays_on_one_instance() -> None:
    s, pool = Session(), pool_of("mixed", 4)
    for n in range(20):
        first = pick(s, pool, "mixed", "requests", session=f"user-{n}")
        again = {pick(s, pool, "mixed", "requests", session=f"user-{n}") for _ in range(5)}
        assert again == {first}


def test_conversations_spread_over_the_instances() -> None:
    s, pool = Session(), pool_of("mixed", 4)
    counts = Counter(pick(s, pool, "mixed", "requests", session=f"c{n}").url for n in range(4000))  # type: ignore[union-attr]
    assert len(counts) == 4
    assert max(counts.values()) < 1.5 * min(counts.values()), counts  # 64 points each: near even


def test_an_instance_that_leaves_moves_only_its_own_conversations() -> None:
    s, pool = Session(), pool_of("mixed", 4)
    keys = [f"c{n}" for n in range(400)]
    before = {k: pick(s, pool, "mixed", "requests", session=k) for k in keys}
    gone = pool.by_role["mixed"][2]
    gone.healthy = False
    after = {k: pick(s, pool, "mixed", "requests", session=k) for k in keys}
    moved = [k for k in keys if after[k] is not before[k]]
    assert moved and all(before[k] is gone for k in moved)
    assert all(after[k] is not gone for k in keys)
    gone.healthy = True  # back: its conversations come back to it
    assert {k: pick(s, pool, "mixed", "requests", session=k) for k in keys} == before


def test_a_busy_instance_spills_its_conversation_to_the_next_within_the_bound() -> None:
    s, pool = Session(), pool_of("mixed", 4)
    home = pick(s, pool, "mixed", "requests", session="hot")
    assert home is not None
    for _ in range(8):  # 8 in flight there, none elsewhere: 1.25 x (8 + 1) / 4 = 2.8 < 9
        home.acquire(10)
    spilled = pick(s, pool, "mixed", "requests", session="hot")
    assert spilled is not None and spilled is not home
    assert pick(s, pool, "mixed", "requests", session="hot") is spilled  # the same next one each time
    for _ in range(8):
        home.release(10)
    assert pick(s, pool, "mixed", "requests", session="hot") is home


def test_the_bound_in_tokens_counts_this_request() -> None:
    s, pool = Session(), pool_of("prefill", 2)
    home = pick(s, pool, "prefill", "tokens", session="u", tokens=100)
    assert home is not None
    home.acquire(100)  # 1.25 x (100 + 100) / 2 = 125 < 200: a second prompt of 100 goes elsewhere
    assert pick(s, pool, "prefill", "tokens", session="u", tokens=100) is not home
    assert pick(s, pool, "prefill", "tokens", session="u", tokens=10) is not home  # 1.25 x 110 / 2 < 110
    home.release(100)
    assert pick(s, pool, "prefill", "tokens", session="u", tokens=100) is home


def test_without_a_conversation_it_goes_by_load() -> None:
    s, pool = Session(), pool_of("decode", 3)
    a, b, c = pool.by_role["decode"]
    a.acquire(1)
    b.acquire(1)
    assert pick(s, pool, "decode", "requests") is c
