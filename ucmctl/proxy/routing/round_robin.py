"""`round-robin`: each leg to the next instance of its role in turn, whatever their load (upstream
UCM's proxy does this)."""

from __future__ import annotations

from collections.abc import Sequence

from ucmctl.core.routing_names import SUMMARIES
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.routing.base import Ask, Policy


class RoundRobin(Policy):
    name = "round-robin"
    summary = SUMMARIES["round-robin"]

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def choose(self, cands: Sequence[Instance], ask: Ask) -> Instance:
        turn = self._next.get(ask.role, 0)
        self._next[ask.role] = turn + 1
        return cands[turn % len(cands)]
