"""Server time series of a phase: every instance's /metrics read at an interval while the phase
runs, keeping the series that show what the deployment did meanwhile (requests running and
waiting, KV cache usage, hit counters, preemptions, the UCM store's errors, KV transferred
point to point). Gauges are kept as read; counters as their running totals (a plot takes their
increase per interval). A read that did not answer in time is a gap (None), never a zero.

The reads run beside the phase's requests on the same event loop; each parses only the lines
of the series kept, so that sampling every second costs the phase little
(benchmarks/sampling_cost.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import aiohttp

from ucmctl.bench.hitrate import METRICS, Instance
from ucmctl.bench.scrape import fetch_metrics
from ucmctl.core.exposition import samples

# name in the result: the Prometheus series (a counter's _total suffix is read too)
SERIES = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv_usage": "vllm:kv_cache_usage_perc",
    "local_queries": METRICS.local_queries,
    "local_hits": METRICS.local_hits,
    "external_queries": METRICS.external_queries,
    "external_hits": METRICS.external_hits,
    "preemptions": METRICS.preemptions,
    "ucm_load_errors": "vllm:ucm_load_errors",
    "ucm_save_errors": "vllm:ucm_save_errors",
    "ucm_lookup_errors": "vllm:ucm_lookup_errors",
}
GAUGES = ("running", "waiting", "kv_usage")
TRANSFERRED = "kv_transfer_tokens"  # prompt tokens that came through the KV connector (P2P)
_BY_NAME = {n: k for k, n in SERIES.items()} | {n + "_total": k for k, n in SERIES.items()}
_FIRST = tuple({n.split(":", 1)[0] for n in SERIES.values()} | {"vllm"})  # cheap line filter
_BY_SOURCE = (METRICS.prompt_tokens_by_source, METRICS.prompt_tokens_by_source + "_total")


def parse(text: str) -> dict[str, float]:
    """The kept series of one /metrics text, each summed over its label sets (engines)."""
    out: dict[str, float] = {}
    for s in samples(text, _FIRST):
        key = _BY_NAME.get(s.name)
        if key is None and s.name in _BY_SOURCE and s.label("source") == METRICS.transfer_source:
            key = TRANSFERRED
        if key is not None:
            out[key] = out.get(key, 0.0) + s.value
    return out


class Sampler:
    """Reads every instance each `interval` seconds until stopped; `result()` is the series."""

    def __init__(self, http: aiohttp.ClientSession, instances: list[Instance], interval: float) -> None:
        self.http, self.instances, self.interval = http, instances, interval
        self.t: list[float] = []
        self.values: dict[str, list[dict[str, float] | None]] = {i.name: [] for i in instances}
        self._task: asyncio.Task[None] | None = None
        self._start = 0.0

    def start(self) -> None:
        self._start = time.perf_counter()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> dict[str, Any]:
        """The series, with one last read at the phase's end."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            await self._sample(time.perf_counter() - self._start)
        return self.result()

    async def _sample(self, at: float) -> None:
        read = await asyncio.gather(*(self._one(i) for i in self.instances))
        self.t.append(round(at, 3))
        for inst, values in zip(self.instances, read, strict=True):
            self.values[inst.name].append(values)

    async def _one(self, inst: Instance) -> dict[str, float] | None:
        text = await fetch_metrics(self.http, inst.url, max(self.interval, 1.0))
        return parse(text) if text is not None else None

    async def _run(self) -> None:
        tick = 0
        while True:
            await self._sample(time.perf_counter() - self._start)
            tick += 1
            await asyncio.sleep(max(0.0, self._start + tick * self.interval - time.perf_counter()))

    def result(self) -> dict[str, Any]:
        """{"interval_s", "t": [s since the phase began], "instances": {name: {"role", series:
        [value or None]}}}; a series no read of an instance had is left out."""
        out: dict[str, Any] = {"interval_s": self.interval, "t": list(self.t), "instances": {}}
        for inst in self.instances:
            reads = self.values[inst.name][: len(self.t)]
            names = [k for k in (*SERIES, TRANSFERRED) if any(r is not None and k in r for r in reads)]
            series: dict[str, Any] = {"role": inst.role}
            for k in names:
                series[k] = [None if r is None else r.get(k) for r in reads]
            out["instances"][inst.name] = series
        return out
