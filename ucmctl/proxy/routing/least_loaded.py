"""`least-loaded`: the instance with the least in flight by the leg's measure, ties round-robin."""

from __future__ import annotations

from collections.abc import Sequence

from ucmctl.core.routing_names import SUMMARIES
from ucmctl.proxy.pool import Instance, load_of
from ucmctl.proxy.routing.base import Ask, Policy


class LeastLoaded(Policy):
    """The least loaded by the leg's measure; equal loads are served round-robin (the scan
    starts one past the last choice)."""

    name = "least-loaded"
    summary = SUMMARIES["least-loaded"]

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def choose(self, cands: Sequence[Instance], ask: Ask) -> Instance:
        n = len(cands)
        start = self._next.get(ask.role, 0) % n
        best, best_k, best_load = cands[start], 0, load_of(cands[start], ask.load)
        for k in range(1, n):
            inst = cands[(start + k) % n]
            load = load_of(inst, ask.load)
            if load < best_load:
                best, best_k, best_load = inst, k, load
        self._next[ask.role] = start + best_k + 1
        return best
