"""Routing policies: which instance takes a leg. One module per policy and one line each here;
their names are ucmctl.core.routing_names' (the topology's `proxy: {routing: NAME}` and
`ucmctl proxy --routing NAME`)."""

from __future__ import annotations

from ucmctl.core.routing_names import ALIASES, DEFAULT, canonical
from ucmctl.proxy.kv_index import KvIndex
from ucmctl.proxy.routing.affinity import Affinity
from ucmctl.proxy.routing.base import Ask, Policy
from ucmctl.proxy.routing.kv import Kv
from ucmctl.proxy.routing.least_loaded import LeastLoaded
from ucmctl.proxy.routing.round_robin import RoundRobin
from ucmctl.proxy.routing.session import Session

POLICIES: dict[str, type[Policy]] = {
    RoundRobin.name: RoundRobin,
    LeastLoaded.name: LeastLoaded,
    Affinity.name: Affinity,
    Session.name: Session,
    Kv.name: Kv,
}


def make_policy(
    name: str, block_size: int = 16, index: KvIndex | None = None, *, store: bool = True
) -> Policy:
    """A fresh policy of that name (`block_size`, `index`, `store`: the servers' block size, the
    proxy's index of where prompts' blocks are and whether the store's content counts, for `kv`)."""
    cls = POLICIES[ALIASES.get(name, name)]
    return Kv(block_size, index, store=store) if cls is Kv else cls()


__all__ = ["ALIASES", "DEFAULT", "POLICIES", "Ask", "Policy", "canonical", "make_policy"]
