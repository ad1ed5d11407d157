"""One read of a server's (or the proxy's) Prometheus page, for everything the benchmark takes
from one: hit counters, KV capacity, the time series, the KV handover, a fault's counts."""

from __future__ import annotations

import asyncio

import aiohttp

SCRAPE_TIMEOUT_S = 15.0  # a loaded server's /metrics (thousands of histogram lines) at a phase's edge


async def fetch_metrics(http: aiohttp.ClientSession, base_url: str, timeout_s: float) -> str | None:
    """The text of `base_url`/metrics; None when it did not come within `timeout_s` seconds, did
    not answer 200, or was not text (a server mid-restart): the caller counts that instance as
    unread, never fails the phase for it."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with http.get(f"{base_url}/metrics", timeout=timeout) as r:
            return await r.text() if r.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, UnicodeDecodeError):
        return None
