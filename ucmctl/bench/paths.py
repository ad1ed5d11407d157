"""The paths PD requests took through ucmctl's proxy in a phase (`ucmctl_proxy_requests_by_path_total`):
disaggregated (a prefill leg, then decode) or direct (the decode instance prefilled them itself,
the proxy's selective disaggregation). A phase's figures are the counters' deltas across it."""

from __future__ import annotations

from ucmctl.core.exposition import samples
from ucmctl.core.metric_names import PROXY_PATHS

PATHS = ("disaggregated", "direct", "direct_saturated")  # direct_saturated: every prefill was busy


def parse(text: str) -> dict[str, float]:
    counts = dict.fromkeys(PATHS, 0.0)
    for s in samples(text, (PROXY_PATHS,)):
        path = s.label("path")
        if s.name == PROXY_PATHS and path in counts:
            counts[path] += s.value
    return counts


def merged(readings: list[dict[str, float]]) -> dict[str, float]:
    """The counts of several proxies (replicas) together."""
    return {p: sum(r[p] for r in readings) for p in PATHS}


def phase_counts(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, int] | None:
    """The phase's requests by path; None unless some went direct (the proxy skipped no prefill
    leg, or was not read, or started again meanwhile: its counters fell)."""
    if before is None or after is None:
        return None
    counts = {p: int(after[p] - before[p]) for p in PATHS}
    if any(n < 0 for n in counts.values()) or not (counts["direct"] or counts["direct_saturated"]):
        return None
    return counts
