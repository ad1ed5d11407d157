"""Each instance's KV-cache capacity and preemptions, read from its Prometheus `/metrics`.

vLLM 0.32 exposes its CacheConfig as an info-style gauge, one line per engine, with every
field as a label (`CacheConfig.metrics_info()`: str() of each value, "None" when unset):

    vllm:cache_config_info{...,block_size="16",...,engine="0",...,num_gpu_blocks="2620",...} 1.0

With data parallelism the front end sums num_gpu_blocks over the engines it talks to before it
logs the config (vllm/v1/engine/core_client.py, `_apply_ready_response`: "Sum num_gpu_blocks
from all engines in DP case"), and `log_metrics_info` (vllm/v1/metrics/loggers.py) then prints
that same config once per engine. So every engine's line already carries the instance's total:
it is read once, not summed over engines. Preemptions are a counter per engine,
`vllm:num_preemptions_total{engine=...,model_name=...}`, summed over engines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from ucmctl.bench.hitrate import METRICS, Instance
from ucmctl.bench.scrape import SCRAPE_TIMEOUT_S, fetch_metrics
from ucmctl.core import exposition
from ucmctl.core.exposition import samples
from ucmctl.engines.base import Metrics


@dataclass(frozen=True)
class KvCapacity:
    instance: str
    role: str
    blocks: int | None  # the instance's KV blocks (all its engines); None when it does not say
    block_size: int | None

    @property
    def tokens(self) -> int | None:
        if self.blocks is None or self.block_size is None:
            return None
        return self.blocks * self.block_size


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:  # "None", or anything else vLLM did not mean as a count
        return None


def parse_capacity(text: str, metrics: Metrics = METRICS) -> tuple[int | None, int | None]:
    """(the instance's KV blocks, block size) from the engine's cache config info
    (`vllm:cache_config_info`); (None, None) when absent or unparsable. Engines' lines repeat
    the instance total; should they ever differ, the largest is taken (never their sum, which
    would count each block once per engine)."""
    blocks: int | None = None
    block_size: int | None = None
    info = metrics.cache_config_info
    for s in samples(text, (info,)):
        if s.name != info:
            continue
        labels = s.labels
        n, size = _int(labels.get("num_gpu_blocks")), _int(labels.get("block_size"))
        if n is None or size is None or n < 0 or size < 1:
            continue
        blocks = n if blocks is None else max(blocks, n)
        block_size = size
    if blocks is None:
        return None, None
    return blocks, block_size


def parse_preemptions(text: str, metrics: Metrics = METRICS) -> float:
    """The engine's preemptions (`vllm:num_preemptions_total`, or without `_total`) summed over
    engines; 0.0 when absent."""
    return exposition.total(text, frozenset((metrics.preemptions + "_total", metrics.preemptions))) or 0.0


async def read_capacities(
    http: aiohttp.ClientSession, instances: Sequence[Instance], metrics: Metrics = METRICS
) -> list[KvCapacity]:
    """Every instance's capacity, in order, as its engine (`metrics`' names) exports it; blocks
    None for one whose /metrics did not answer."""

    async def one(inst: Instance) -> KvCapacity:
        text = await fetch_metrics(http, inst.url, SCRAPE_TIMEOUT_S)
        blocks, size = parse_capacity(text, metrics) if text is not None else (None, None)
        return KvCapacity(inst.name, inst.role, blocks, size)

    return list(await asyncio.gather(*(one(i) for i in instances)))


def capacity_warning(capacities: Sequence[KvCapacity], in_flight_tokens: int) -> str | None:
    """One line when the workload keeps more tokens in flight than the KV cache of the
    instances that hold them while decoding (decode instances if any, else every instance
    that is not a prefill one): vLLM then preempts and recomputes, and everything slows."""
    decode = [c for c in capacities if c.role == "decode"]
    side = decode or [c for c in capacities if c.role != "prefill"]
    known = [c for c in side if c.tokens is not None]
    if not known:
        return None
    capacity = sum(c.tokens or 0 for c in known)
    if in_flight_tokens <= capacity:
        return None
    role = "decode" if decode else (known[0].role if len({c.role for c in known}) == 1 else "serving")
    count = f"{len(known)} instance{'s' if len(known) != 1 else ''}"
    sizes = {c.block_size for c in known}
    blocks = sum(c.blocks or 0 for c in known)
    layout = f"{blocks:,} blocks of {sizes.pop()}" if len(sizes) == 1 else f"{blocks:,} blocks"
    return (
        f"warning: up to {in_flight_tokens:,} tokens in flight, {role}'s KV cache holds {capacity:,} "
        f"({count}, {layout}): expect preemptions; lower --concurrency or raise the KV cache"
    )
