"""Goodput as `vllm bench serve --goodput` defines it (vllm/benchmarks/serve.py: `parse_goodput`,
`check_goodput_args`, and the `good_completed` count in `calculate_metrics`).

A successful request is good when each metric given an SLO is at most that SLO: TTFT, TPOT
(`(latency - ttft) / (output_tokens - 1)`, taken as 0 when the request produced at most one
token) and E2EL. The comparison is vLLM's own, in seconds: `slo_ms / 1000 >= metric_s`, so a
request exactly on its SLO is good. Failed requests are never good.
`request_goodput = good_completed / duration` (req/s).

Stricter than vLLM on input: vLLM accepts a value of 0, a metric given twice (the last one wins)
and `inf`/`nan`; here each is an error, since none of them describes a usable SLO.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ucmctl.bench.client import RequestResult
from ucmctl.core.errors import UcmctlError

SLO_METRICS = ("ttft", "tpot", "e2el")
MS_PER_S = 1000  # vLLM's MILLISECONDS_TO_SECONDS_CONVERSION
_KEY = "--goodput"
_FIX = "give KEY:VALUE pairs in ms, KEY one of ttft, tpot, e2el, e.g. --goodput ttft:500 tpot:50"


def _bad(message: str) -> UcmctlError:
    return UcmctlError.one(message, key=_KEY, fix=_FIX)


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` (or one item `"ttft:500 tpot:50"`) -> `{"ttft": 500.0, "tpot": 50.0}`.
    No items -> `{}` (no goodput asked for); bad input -> a one-line UcmctlError on `--goodput`."""
    if isinstance(items, str):  # a bare string is one item, not a sequence of characters
        items = [items]
    pairs = [pair for item in items for pair in item.split()]
    if items and not pairs:
        raise _bad("no SLO given")
    slos: dict[str, float] = {}
    for pair in pairs:
        parts = pair.split(":")
        if len(parts) != 2:
            raise _bad(f"{pair!r} is not KEY:VALUE")
        name, text = parts
        if name not in SLO_METRICS:
            raise _bad(f"unknown metric {name!r} in {pair!r}")
        try:
            value = float(text)
        except ValueError:
            raise _bad(f"{text!r} in {pair!r} is not a number of milliseconds") from None
        if not math.isfinite(value):
            raise _bad(f"{text!r} in {pair!r} is not a finite number of milliseconds")
        if value <= 0:
            raise _bad(f"{pair!r}: the SLO must be > 0 ms")
        if name in slos:
            raise _bad(f"{name} given twice")
        slos[name] = value
    return slos


def _tpot_s(r: RequestResult) -> float:
    """vLLM's per-request TPOT for goodput: 0 when the request produced at most one token."""
    if r.output_tokens > 1:
        return (r.latency - r.ttft) / (r.output_tokens - 1)
    return 0.0


def good_count(results: Sequence[RequestResult], slos_ms: Mapping[str, float]) -> int:
    """How many successful requests meet every SLO in `slos_ms` (ms, keys from SLO_METRICS).
    With no SLO every successful request counts (nothing to miss); `goodput_fields` reports
    no goodput at all in that case, as vLLM does."""
    unknown = sorted(set(slos_ms) - set(SLO_METRICS))
    if unknown:
        raise ValueError(f"unknown SLO metrics {unknown}; expected some of {SLO_METRICS}")
    limits_s = [(name, slos_ms[name] / MS_PER_S) for name in SLO_METRICS if name in slos_ms]
    good = 0
    for r in results:
        if not r.ok:
            continue
        measured = {"ttft": r.ttft, "tpot": _tpot_s(r), "e2el": r.latency}
        if all(limit >= measured[name] for name, limit in limits_s):
            good += 1
    return good


def goodput_fields(
    results: Sequence[RequestResult], duration_s: float, slos_ms: Mapping[str, float]
) -> dict[str, Any]:
    """The phase's goodput keys: `request_goodput` (req/s; None when the duration is not > 0 or
    no SLO was given), `good_completed` (None when no SLO was given) and `goodput_slos_ms`."""
    if not slos_ms:
        return {"request_goodput": None, "good_completed": None, "goodput_slos_ms": {}}
    good = good_count(results, slos_ms)
    return {
        "request_goodput": good / duration_s if duration_s > 0 else None,
        "good_completed": good,
        "goodput_slos_ms": dict(slos_ms),
    }
