"""A pool of instances and a pick through a policy, as the proxy's state makes it."""

from __future__ import annotations

from ucmctl.proxy.pool import Instance, LoadKind, Pool
from ucmctl.proxy.routing import Ask, Policy


def pool_of(role: str, n: int, pool: Pool | None = None) -> Pool:
    pool = pool or Pool()
    for i in range(n):
        pool.add(f"http://127.0.0.1:{8000 + i}", role)
    return pool


def port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def pick(
    policy: Policy,
    pool: Pool,
    role: str,
    load: LoadKind,
    *,
    exclude: list[Instance] | None = None,
    prefix: bytes | None = None,
    session: str | None = None,
    tokens: int = 0,
) -> Instance | None:
    cands = pool.candidates(role, exclude or ())
    return policy.choose(cands, Ask(role, load, tokens, prefix, session)) if cands else None
