"""`affinity`: prompts with the same leading block go to the instance that took that block last,
while it is a candidate (even when busier), so its local prefix cache serves them; a new block
goes by load. The table is bounded (least recently used out) so that a stream of unique
prompts cannot grow it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from ucmctl.core.routing_names import SUMMARIES
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.routing.base import Ask, Policy
from ucmctl.proxy.routing.least_loaded import LeastLoaded

ENTRIES = 65536


class Affinity(Policy):
    name = "affinity"
    summary = SUMMARIES["affinity"]
    needs_prefix = True

    def __init__(self, entries: int = ENTRIES) -> None:
        self._by_load = LeastLoaded()
        self._table: OrderedDict[bytes, Instance] = OrderedDict()
        self._entries = entries

    def choose(self, cands: Sequence[Instance], ask: Ask) -> Instance:
        key = ask.prefix
        if key is None:
            return self._by_load.choose(cands, ask)
        sticky = self._table.get(key)
        if sticky is not None and sticky in cands:
            self._table.move_to_end(key)
            return sticky
        chosen = self._by_load.choose(cands, ask)
        self._table[key] = chosen
        self._table.move_to_end(key)
        if len(self._table) > self._entries:
            self._table.popitem(last=False)
        return chosen

    def forget(self, gone: Iterable[Instance]) -> None:
        dead = set(gone)
        for key in [k for k, v in self._table.items() if v in dead]:
            del self._table[key]

    def __len__(self) -> int:
        return len(self._table)
