"""`session`: the requests of one conversation to one instance, so that each turn finds the last
one's KV in that instance's own cache, with a bound on load (consistent hashing with bounded
loads, Mirrokni, Thorup and Zadimoghaddam 2018).

A conversation is named by the `X-Session-Id` header, else the body's OpenAI `user` field; a
request with neither goes by load. Each instance has points on a hash ring (by its URL, so
every proxy replica and every restart draws the same ring); a conversation takes the first
instance clockwise from its own point whose load, with this request, stays within `bound`
times the average. An instance that leaves moves only its own conversations, and a hot
conversation spills to the next instance on the ring rather than overloading one."""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence

from ucmctl.core.routing_names import SUMMARIES
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.routing.base import Ask, Policy
from ucmctl.proxy.routing.least_loaded import LeastLoaded

POINTS = 64  # per instance: keys spread within a few percent of even over a handful of instances
BOUND = 1.25  # no instance takes more than this times the average load


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Session(Policy):
    name = "session"
    summary = SUMMARIES["session"]

    def __init__(self, bound: float = BOUND, points: int = POINTS) -> None:
        self._by_load = LeastLoaded()
        self._bound = bound
        self._points = points
        self._rings: dict[tuple[str, ...], tuple[list[int], list[int]]] = {}

    def _ring(self, cands: Sequence[Instance]) -> tuple[list[int], list[int]]:
        """The ring of these candidates: sorted points and, for each, the index of its instance."""
        urls = tuple(i.url for i in cands)
        ring = self._rings.get(urls)
        if ring is None:
            spread = range(self._points)
            pairs = sorted((_point(f"{url}#{k}"), n) for n, url in enumerate(urls) for k in spread)
            ring = ([p for p, _ in pairs], [n for _, n in pairs])
            if len(self._rings) >= 64:  # membership changes rarely; a bounded cache
                self._rings.clear()
            self._rings[urls] = ring
        return ring

    def choose(self, cands: Sequence[Instance], ask: Ask) -> Instance:
        if ask.session is None or len(cands) == 1:
            return self._by_load.choose(cands, ask)
        by_tokens = ask.load == "tokens"
        adds = max(ask.tokens, 1) if by_tokens else 1

        def units(inst: Instance) -> int:
            return inst.tokens if by_tokens else inst.requests

        cap = self._bound * (sum(units(i) for i in cands) + adds) / len(cands)
        if not by_tokens:
            cap = math.ceil(cap)  # in requests, as the bound's paper counts
        points, owners = self._ring(cands)
        start = bisect.bisect(points, _point(ask.session))
        seen: set[int] = set()
        for k in range(len(points)):
            n = owners[(start + k) % len(points)]
            if n in seen:
                continue
            seen.add(n)
            if units(cands[n]) + adds <= max(cap, adds):
                return cands[n]
            if len(seen) == len(cands):
                break
        return self._by_load.choose(cands, ask)
