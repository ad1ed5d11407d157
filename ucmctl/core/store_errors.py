"""The kinds of a store's per-block error text, as the connector and the simulator count them.

A leaf module (the standard library and core's exposition and metric names), imported by the
connector on the nodes and by the simulator: both name the same kinds in their
`vllm:ucm_load_errors_<kind>` counters, and the benchmark reads those to say why loads missed in
a phase.
"""

from __future__ import annotations

import errno
import re
import time
from collections.abc import Callable

from ucmctl.core.exposition import samples
from ucmctl.core.metric_names import UCM_PREFIX

# What a network filesystem gives (a handle gone stale, the server gone, an I/O error), a load
# not finished in time, a block that failed its checksum.
LOAD_KINDS = ("estale", "enotconn", "eio", "timeout", "corrupt")
# A dump not stored (or persisted) in time, one dropped because the storage is far behind.
SAVE_KINDS = ("timeout", "dropped")
# A lookup the storage failed to answer (the store's own counters), or not in time.
LOOKUP_KINDS = ("estale", "enotconn", "eio", "timeout")


# A store wait past its bound by more than this is a bug of the bounding, counted per op as
# `<op>_waits_over_bound` (vllm:ucm_<op>_waits_over_bound_total): the storage-fault tests
# hold it to 0, and an operator can alert on it.
OVER_BOUND_GRACE_S = 1.0
WAIT_OPS = ("lookup", "load", "save")


def over_bound(took_s: float, bound_s: float | None) -> bool:
    """Did one store wait outlast its bound by more than the grace?"""
    return bound_s is not None and took_s > bound_s + OVER_BOUND_GRACE_S


def time_left(bound_s: float | None, started: float) -> float | None:
    """What is left of a bound that began at `started` (time.perf_counter()), for the next of
    several store calls that together make one bounded wait; None without a bound. Raises
    TimeoutError when nothing is left."""
    if bound_s is None:
        return None
    left = bound_s - (time.perf_counter() - started)
    if left <= 0:
        raise TimeoutError(f"the bound of {bound_s:g} s was spent before the last call")
    return left


def lookup_errors(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """`lookup_errors` and `lookup_errors_<kind>` between two `Store.stats()` snapshots."""
    out = {"lookup_errors": after.get("lookup_errors", 0) - before.get("lookup_errors", 0)}
    for kind in LOOKUP_KINDS[:-1]:
        out[f"lookup_errors_{kind}"] = after.get(f"lookup_{kind}", 0) - before.get(f"lookup_{kind}", 0)
    return out


class LookupErrorsSince:
    """The store's lookup error counters since the last look, for a caller that counts them as
    its own (a lookup stuck past its bound counts when it finally returns)."""

    def __init__(self, stats: Callable[[], dict[str, int]]) -> None:
        self._stats = stats
        self._seen = stats()

    def take(self) -> dict[str, int]:
        now = self._stats()
        out, self._seen = lookup_errors(self._seen, now), now
        return out


_ERRNO = re.compile(r"\(errno (\d+)\)")
_KIND_OF_ERRNO = {errno.ESTALE: "estale", errno.ENOTCONN: "enotconn", errno.EIO: "eio"}


def error_kind(reason: str) -> str | None:
    """The kind of one block's error text, None for another kind."""
    if "TimeoutError" in reason or "timed out" in reason or "not persisted within" in reason:
        return "timeout"
    if "block dropped" in reason:
        return "dropped"
    if "corrupt" in reason or "checksum" in reason:
        return "corrupt"
    found = _ERRNO.search(reason)
    return _KIND_OF_ERRNO.get(int(found[1])) if found else None


OPS = {"lookup": LOOKUP_KINDS, "load": LOAD_KINDS, "save": SAVE_KINDS}
_NAME = re.compile(
    rf"^{re.escape(UCM_PREFIX)}(lookup|load|save)_(?:errors(?:_([a-z]+))?|(waits_over_bound))_total$"
)


def errors_from_metrics(text: str) -> dict[str, float]:
    """A server's UCM store error counters from its Prometheus text, summed over engines:
    `{"lookup": n, "lookup_enotconn": n, ..., "save_dropped": n, "load_waits_over_bound": n}`
    (absent ones are 0)."""
    out = {op: 0.0 for op in OPS} | {f"{op}_{k}": 0.0 for op, kinds in OPS.items() for k in kinds}
    out |= {f"{op}_waits_over_bound": 0.0 for op in WAIT_OPS}
    for s in samples(text, (UCM_PREFIX,)):
        m = _NAME.match(s.name)
        if m is None:
            continue
        key = f"{m[1]}_{m[2] or m[3]}" if m[2] or m[3] else m[1]
        if key in out:
            out[key] += s.value
    return out


_WORDS = {"lookup": "block lookup(s) failed", "load": "block load(s) missed", "save": "block save(s) failed"}


def describe(counts: dict[str, float], *, words: bool = False) -> str:
    """The non-zero ones: `lookup 3 (enotconn 3), save 8 (timeout 8)`, or with `words`
    `3 block lookup(s) failed (enotconn 3); 8 block save(s) failed (timeout 8)`; "" when none.
    Keys as `errors_from_metrics` gives them."""
    parts = []
    for op, kinds in OPS.items():
        n = int(counts.get(op, 0))
        if n:
            by = ", ".join(f"{k} {int(counts[f'{op}_{k}'])}" for k in kinds if counts.get(f"{op}_{k}"))
            parts.append((f"{n} {_WORDS[op]}" if words else f"{op} {n}") + (f" ({by})" if by else ""))
    over = sum(int(counts.get(f"{op}_waits_over_bound", 0)) for op in WAIT_OPS)
    if over:
        parts.append(f"{over} wait(s) past the bound + {OVER_BOUND_GRACE_S:g} s")
    return ("; " if words else ", ").join(parts)
