"""The measured prefix-cache hit rate: deltas of every instance's Prometheus counters.

vLLM counts, in tokens, local prefix-cache queries and hits (`vllm:prefix_cache_*`) and, for
any KV connector, external ones (`vllm:external_prefix_cache_*`). A phase's rate is the delta
of hits over the delta of queries across it, per instance, per role and over all instances.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from ucmctl.bench.scrape import SCRAPE_TIMEOUT_S, fetch_metrics
from ucmctl.core.errors import UcmctlError
from ucmctl.core.exposition import samples
from ucmctl.core.metric_names import PROCESS_START, ucm_counter
from ucmctl.core.store_errors import LOAD_KINDS, LOOKUP_KINDS, SAVE_KINDS, WAIT_OPS
from ucmctl.engines import DEFAULT_ENGINE, Metrics, engine_for

# The series of the default engine (vLLM's): a run passes its engine's `Metrics` to what reads.
METRICS = engine_for(DEFAULT_ENGINE).metrics
# The UCM connector's block counters (the simulator exports the same names): why loads missed
# (a network filesystem's errors, timeouts) and saves failed, per phase.
UCM_KEYS = (
    "ucm_load_errors",
    *(f"ucm_load_errors_{k}" for k in LOAD_KINDS),
    "ucm_lookup_errors",
    *(f"ucm_lookup_errors_{k}" for k in LOOKUP_KINDS),
    "ucm_save_errors",
    *(f"ucm_save_errors_{k}" for k in SAVE_KINDS),
    # store waits that outlasted their bound by over a second: 0 unless the bounding fails
    *(f"ucm_{op}_waits_over_bound" for op in WAIT_OPS),
)


def counter_names(metrics: Metrics = METRICS) -> dict[str, str]:
    """Our key: the Prometheus counter, of an engine's series and the UCM connector's."""
    return {
        "local_queries": metrics.local_queries,
        "local_hits": metrics.local_hits,
        "external_queries": metrics.external_queries,
        "external_hits": metrics.external_hits,
        "preemptions": metrics.preemptions,  # not a hit counter: read with them, reported per phase
        **{k: ucm_counter(k.removeprefix("ucm_")) for k in UCM_KEYS},
    }


COUNTERS = counter_names()  # the default engine's; its keys are every engine's


@dataclass(frozen=True)
class Instance:
    name: str
    role: str
    url: str  # base URL: /metrics and /reset_prefix_cache live under it


def parse_counters(text: str, metrics: Metrics = METRICS) -> dict[str, float]:
    """Our counters from a Prometheus exposition of an engine of `metrics`, summed over label
    sets (engines); with `started`, the server's process start time when it says it (a restart
    changes it)."""
    wanted: dict[str, str] = {PROCESS_START: "started"}
    for key, name in counter_names(metrics).items():
        wanted[name] = key
        wanted[name + "_total"] = key
    out = dict.fromkeys(COUNTERS, 0.0)
    for s in samples(text):
        found = wanted.get(s.name)
        if found is not None:
            out[found] = out.get(found, 0.0) + s.value
    return out


async def scrape(
    http: aiohttp.ClientSession, instances: list[Instance], metrics: Metrics = METRICS
) -> dict[str, dict[str, float] | None]:
    """Every instance's counters (served by an engine of `metrics`); None for one whose
    /metrics did not answer."""

    async def one(inst: Instance) -> dict[str, float] | None:
        text = await fetch_metrics(http, inst.url, SCRAPE_TIMEOUT_S)
        return parse_counters(text, metrics) if text is not None else None

    values = await asyncio.gather(*(one(i) for i in instances))
    return {inst.name: v for inst, v in zip(instances, values, strict=True)}


def merge(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Several phases' `hit_rates` as one: counter deltas summed, rates recomputed."""

    def total(parts: list[dict[str, Any] | None]) -> dict[str, Any] | None:
        known = [p for p in parts if p]
        if not known:
            return None
        return _rates({k: float(sum(p.get(k, 0) for p in known)) for k in COUNTERS})

    roles = list(dict.fromkeys(r for p in phases for r in (p.get("by_role") or {})))
    names = list(dict.fromkeys(n for p in phases for n in (p.get("by_instance") or {})))
    per: dict[str, Any] = {}
    for name in names:
        merged = total([(p.get("by_instance") or {}).get(name) for p in phases])
        role = next(p["by_instance"][name]["role"] for p in phases if name in (p.get("by_instance") or {}))
        per[name] = {"role": role, **(merged or {})}
    return {
        "total": total([p.get("total") for p in phases]),
        "by_role": {r: total([(p.get("by_role") or {}).get(r) for p in phases]) for r in roles},
        "by_instance": per,
        "missing": sorted({m for p in phases for m in p.get("missing") or []}),
        "restarted": sorted({m for p in phases for m in p.get("restarted") or []}),
    }


def _rates(c: dict[str, float]) -> dict[str, Any]:
    lq, lh, eq, eh = (c["local_queries"], c["local_hits"], c["external_queries"], c["external_hits"])
    return {
        **{k: int(v) for k, v in c.items()},
        "local_hit_rate": lh / lq if lq else None,
        "external_hit_rate": eh / eq if eq else None,
        # Share of queried prompt tokens that were not recomputed (local or external hit).
        "hit_rate": (lh + eh) / lq if lq else None,
    }


def hit_rates(
    instances: list[Instance],
    before: dict[str, dict[str, float] | None],
    after: dict[str, dict[str, float] | None],
) -> dict[str, Any]:
    """Rates over all instances, per role and per instance; `missing` names unreadable ones,
    `restarted` those that started again within the phase (their process start time changed, or,
    where the server does not say it, a counter went down): their counts since then are taken,
    those before it are lost with the old process, as Prometheus's increase() takes a reset."""
    total = dict.fromkeys(COUNTERS, 0.0)
    roles: dict[str, dict[str, float]] = {}
    per: dict[str, Any] = {}
    missing = []
    restarted = []
    for inst in instances:
        a, b = before.get(inst.name), after.get(inst.name)
        if a is None or b is None:
            missing.append(inst.name)
            continue
        delta = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in COUNTERS}
        started_again = a.get("started") is not None and b.get("started") not in (None, a.get("started"))
        if started_again or any(v < 0 for v in delta.values()):
            restarted.append(inst.name)
            delta = {k: b.get(k, 0.0) for k in COUNTERS}
        per[inst.name] = {"role": inst.role, **_rates(delta)}
        role = roles.setdefault(inst.role, dict.fromkeys(COUNTERS, 0.0))
        for k in COUNTERS:
            total[k] += delta[k]
            role[k] += delta[k]
    return {
        "total": _rates(total) if len(missing) < len(instances) else None,
        "by_role": {r: _rates(c) for r, c in roles.items()},
        "by_instance": per,
        "missing": missing,
        "restarted": restarted,
    }


async def reset_local_caches(http: aiohttp.ClientSession, instances: list[Instance]) -> None:
    """POST /reset_prefix_cache on every instance: its local (HBM) cache only, not the store."""

    async def one(inst: Instance) -> str | None:
        try:
            async with http.post(f"{inst.url}/reset_prefix_cache") as r:
                text = await r.text()
                if r.status == 404:
                    return f"{inst.name}: /reset_prefix_cache not found"
                if r.status != 200:
                    return f"{inst.name}: /reset_prefix_cache answered {r.status}: {text[:120]}"
                if text.strip().startswith("{") and json.loads(text).get("success") is False:
                    return f"{inst.name}: the reset failed (requests still running?)"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return f"{inst.name}: {type(exc).__name__}: {exc}"
        return None

    problems = [p for p in await asyncio.gather(*(one(i) for i in instances)) if p]
    if problems:
        raise UcmctlError.one(
            "--reset-hbm: " + "; ".join(problems),
            key="--reset-hbm",
            fix="real vLLM serves this route only with VLLM_SERVER_DEV_MODE=1",
        )
