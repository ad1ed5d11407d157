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
from dataclasses import dataclass
from functools import cache
from typing import Any

import aiohttp

from ucmctl.bench.hitrate import METRICS, Instance
from ucmctl.bench.scrape import fetch_metrics
from ucmctl.core.exposition import samples
from ucmctl.core.metric_names import ucm_counter
from ucmctl.engines import Metrics

TRANSFERRED = "kv_transfer_tokens"  # prompt tokens that came through the KV connector (P2P)


def series_names(metrics: Metrics = METRICS) -> dict[str, str]:
    """Name in the result: the Prometheus series, of an engine's and the UCM connector's (a
    counter's _total suffix is read too)."""
    return {
        "running": metrics.requests_running,
        "waiting": metrics.requests_waiting,
        "kv_usage": metrics.kv_cache_usage,
        "local_queries": metrics.local_queries,
        "local_hits": metrics.local_hits,
        "external_queries": metrics.external_queries,
        "external_hits": metrics.external_hits,
        "preemptions": metrics.preemptions,
        **{f"ucm_{k}": ucm_counter(k) for k in ("load_errors", "save_errors", "lookup_errors")},
    }


SERIES = series_names()  # the default engine's; its keys are every engine's


@dataclass(frozen=True)
class _Reader:
    """What a parse looks for: our key by series name, a cheap line filter, the transfer counter."""

    by_name: dict[str, str]
    first: tuple[str, ...]
    by_source: tuple[str, str]
    transfer_source: str


@cache
def _reader(metrics: Metrics) -> _Reader:
    names = series_names(metrics)
    by_source = metrics.prompt_tokens_by_source
    return _Reader(
        by_name={n: k for k, n in names.items()} | {n + "_total": k for k, n in names.items()},
        # the series' namespaces (`vllm`): a line outside them is skipped unparsed
        first=tuple(dict.fromkeys(n.split(":", 1)[0] for n in [*names.values(), by_source])),
        by_source=(by_source, by_source + "_total"),
        transfer_source=metrics.transfer_source,
    )


def parse(text: str, metrics: Metrics = METRICS) -> dict[str, float]:
    """The kept series of one /metrics text of an engine of `metrics`, each summed over its label
    sets (engines)."""
    r = _reader(metrics)
    out: dict[str, float] = {}
    for s in samples(text, r.first):
        key = r.by_name.get(s.name)
        if key is None and s.name in r.by_source and s.label("source") == r.transfer_source:
            key = TRANSFERRED
        if key is not None:
            out[key] = out.get(key, 0.0) + s.value
    return out


class Sampler:
    """Reads every instance each `interval` seconds until stopped; `result()` is the series."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        instances: list[Instance],
        interval: float,
        metrics: Metrics = METRICS,
    ) -> None:
        """`metrics`: the series of the engine that serves the instances."""
        self.http, self.instances, self.interval, self.metrics = http, instances, interval, metrics
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
        return parse(text, self.metrics) if text is not None else None

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
