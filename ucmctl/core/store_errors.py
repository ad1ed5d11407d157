"""The kinds of a store's per-block error text, as the connector and the simulator count them.

A leaf module (standard library only), imported by the connector on the nodes and by the
simulator: both name the same kinds in their `vllm:ucm_load_errors_<kind>` counters, and the
benchmark reads those to say why loads missed in a phase.
"""

from __future__ import annotations

import errno
import re

# What a network filesystem gives (a handle gone stale, the server gone, an I/O error), a load
# not finished in time, a block that failed its checksum.
LOAD_KINDS = ("estale", "enotconn", "eio", "timeout", "corrupt")
# A dump not stored (or persisted) in time, one dropped because the storage is far behind.
SAVE_KINDS = ("timeout", "dropped")
# A lookup the storage failed to answer (the store's own counters), or not in time.
LOOKUP_KINDS = ("estale", "enotconn", "eio", "timeout")


def lookup_errors(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """`lookup_errors` and `lookup_errors_<kind>` between two `Store.stats()` snapshots."""
    out = {"lookup_errors": after.get("lookup_errors", 0) - before.get("lookup_errors", 0)}
    for kind in LOOKUP_KINDS[:-1]:
        out[f"lookup_errors_{kind}"] = after.get(f"lookup_{kind}", 0) - before.get(f"lookup_{kind}", 0)
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
_SAMPLE = re.compile(r"^vllm:ucm_(lookup|load|save)_errors(?:_([a-z]+))?_total(?:\{[^}]*\})? (\S+)$")


def errors_from_metrics(text: str) -> dict[str, float]:
    """A server's UCM store error counters from its Prometheus text, summed over engines:
    `{"lookup": n, "lookup_enotconn": n, ..., "save_dropped": n}` (absent ones are 0)."""
    out = {op: 0.0 for op in OPS} | {f"{op}_{k}": 0.0 for op, kinds in OPS.items() for k in kinds}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        key = m[1] if m[2] is None else f"{m[1]}_{m[2]}"
        if key in out:
            try:
                out[key] += float(m[3])
            except ValueError:
                continue
    return out


def describe(counts: dict[str, float]) -> str:
    """`lookup 3 (enotconn 3), save 8 (timeout 8)` for the non-zero ones; "" when none."""
    parts = []
    for op, kinds in OPS.items():
        n = int(counts.get(op, 0))
        if n:
            by = [f"{k} {int(counts[f'{op}_{k}'])}" for k in kinds if counts.get(f"{op}_{k}")]
            parts.append(f"{op} {n}" + (f" ({', '.join(by)})" if by else ""))
    return ", ".join(parts)
