"""The KV handover of a phase, as ucmctl's proxy measures it: per streamed PD request, the time
from the prefill leg's answer to the decode leg's first streamed bytes (its histogram
`ucmctl_proxy_kv_handover_seconds`). A phase's figures are the histogram's delta across it: the
mean exact (sum / count), p50 and p99 read from the buckets as Prometheus's histogram_quantile
reads them (linear within the bucket; the buckets step by 25%)."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from ucmctl.core.exposition import samples
from ucmctl.core.metric_names import PROXY_KV_HANDOVER

NAME = PROXY_KV_HANDOVER
Reading = tuple[list[tuple[float, float]], float, float]  # (cumulative buckets by bound, sum, count)


def parse(text: str) -> Reading | None:
    """The handover histogram of a /metrics text; None when the server has none (not ucmctl's
    proxy, or a proxy of an older ucmctl)."""
    buckets: list[tuple[float, float]] = []
    total = count = None
    for s in samples(text, (NAME,)):
        if s.name == NAME + "_bucket":
            bound = s.label("le") or ""
            with contextlib.suppress(ValueError):
                buckets.append((math.inf if bound == "+Inf" else float(bound), s.value))
        elif s.name == NAME + "_sum":
            total = s.value
        elif s.name == NAME + "_count":
            count = s.value
    if not buckets or total is None or count is None:
        return None
    return sorted(buckets), total, count


def merged(readings: list[Reading | None]) -> Reading | None:
    """The histograms of several proxies (replicas) as one: counts added bucket by bucket; None
    when one has none (the readings would not be of one thing)."""
    present = [r for r in readings if r is not None]
    if not present or len(present) < len(readings):
        return None
    first = present[0]
    bounds = [b for b, _ in first[0]]
    if any([b for b, _ in r[0]] != bounds for r in present):
        return None
    buckets = [(b, sum(r[0][i][1] for r in present)) for i, b in enumerate(bounds)]
    return buckets, sum(r[1] for r in present), sum(r[2] for r in present)


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """histogram_quantile over cumulative (bound, count) buckets; None without observations."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(bound):  # in the open bucket: the last finite bound is all it can say
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


def phase_figures(before: Reading | None, after: Reading | None) -> dict[str, Any] | None:
    """The phase's handover (ms): count, mean, p50, p99; None when the proxy does not measure it
    or it restarted meanwhile (its histogram started again)."""
    if before is None or after is None:
        return None
    count = after[2] - before[2]
    if count < 0 or [b for b, _ in before[0]] != [b for b, _ in after[0]]:
        return None
    if count == 0:
        return {"count": 0, "mean_ms": None, "p50_ms": None, "p99_ms": None}
    delta = [(b, a - c) for (b, a), (_, c) in zip(after[0], before[0], strict=True)]
    p50, p99 = quantile(0.5, delta), quantile(0.99, delta)
    return {
        "count": int(count),
        "mean_ms": 1000 * (after[1] - before[1]) / count,
        "p50_ms": None if p50 is None else 1000 * p50,
        "p99_ms": None if p99 is None else 1000 * p99,
    }
