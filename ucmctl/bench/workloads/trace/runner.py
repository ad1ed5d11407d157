"""The trace workload: a Mooncake-format trace replayed on its timestamps (or back to back).

Each request's prompt is built from its hash ids (`trace.prompt_ids`: one id, one block of
512 tokens, the same id always the same tokens) and sent when the trace says, scaled by
`speedup`; bodies are encoded a few ahead of their send time, not all up front. The cell
reports how late each send was against the schedule (`send_lag_ms`), and the trace's ideal hit
ratio for an unbounded cache next to the measured one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from typing import TYPE_CHECKING

import aiohttp
import numpy as np

from ucmctl.bench import client
from ucmctl.bench.extras.trace_lag import Lag
from ucmctl.bench.results import Cell
from ucmctl.bench.runner import BenchConfig, NoProgress, Progress, Target, measure
from ucmctl.bench.workloads.trace import format as trace

if TYPE_CHECKING:
    from ucmctl.bench.workloads.trace.spec import TraceSpec

# Connections opened before the clock starts: the trace's first overlapping sends would
# otherwise each open one (TCP set-up, aiohttp's first-use work), late by 20-60 ms.
WARM_CONNECTIONS = 16


async def _open_connections(http: aiohttp.ClientSession, url: str, count: int) -> None:
    """`count` requests at once before the clock starts, each on a connection of its own, left
    open in the session's pool (keep-alive) for the first sends to reuse."""

    async def one() -> None:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
            async with http.get(f"{url}/v1/models", timeout=aiohttp.ClientTimeout(total=15)) as r:
                await r.read()

    await asyncio.gather(*(one() for _ in range(max(1, count))))


def lag_stats(lags: list[float]) -> Lag:
    """How late the sends were, in ms: mean, p50, p99, max (None when nothing was scheduled)."""
    if not lags:
        return Lag(mean=None, p50=None, p99=None, max=None)
    arr = np.asarray(lags, dtype=np.float64) * 1000.0
    return Lag(
        mean=float(arr.mean()),
        p50=float(np.percentile(arr, 50)),
        p99=float(np.percentile(arr, 99)),
        max=float(arr.max()),
    )


async def run_trace(
    cfg: BenchConfig,
    spec: TraceSpec,
    target: Target,
    progress: Progress | None = None,
) -> list[Cell]:
    progress = progress or NoProgress()
    reqs = spec.requests
    stream = cfg.stream_base
    ideal = trace.ideal_hits(reqs, block_size=cfg.block_size)
    schedule = trace.send_schedule(reqs, spec.speedup)
    digest = hashlib.sha256(spec.path.read_bytes()).hexdigest()[:16]

    def body(i: int) -> bytes:
        r = reqs[i]
        ids = trace.prompt_ids(r, seed=cfg.seed, stream=stream, vocab=cfg.vocab)
        return client.make_body(
            ids, r.output_length, cfg.model, cfg.ignore_eos, cfg.temperature, cache_salt=cfg.cache_salt
        )

    async with client.session(cfg.concurrency, cfg.timeout_s) as http:
        await _open_connections(http, target.url, min(cfg.concurrency, WARM_CONNECTIONS))
        phase = await measure(
            http,
            cfg,
            target,
            "replay",
            body,
            [r.input_length for r in reqs],
            progress,
            schedule=schedule if spec.speedup is not None else None,
        )
    lags = [r.lag for r in phase.requests() if r.lag is not None]
    phase.input_len = round(sum(r.input_length for r in reqs) / len(reqs))
    phase.output_len = round(sum(r.output_length for r in reqs) / len(reqs))
    phase.send_lag_ms = lag_stats(lags)
    return [
        Cell(
            workload=spec.kind,
            label=spec.path.name,
            input_len=phase.input_len,
            repeat=0,
            stream=stream,
            preseed=None,
            measure=phase,
            ideal_hit_rate=ideal.ratio,
            ideal_reused_tokens=ideal.reused_tokens,
            ideal_total_tokens=ideal.total_tokens,
            speedup=spec.speedup,
            trace_requests=len(reqs),
            prompts_digest=digest,
            primary=True,
        )
    ]
