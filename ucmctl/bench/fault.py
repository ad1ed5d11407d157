"""`bench --fault ACTION:PROCESS@TIME`: one process of the deployment killed (SIGKILL), stopped
(SIGTERM) or hung (SIGSTOP: alive, its sockets open, sending nothing, as an engine hung on its
device or a node cut off without a reset; SIGCONT when the phase ends) at a time into the first
measure phase, and what that cost, measured in the same phase.

What is reported: whether and when the signal went out; how many answers were streaming from
the process then (the proxy's gauge, read just before); the phase's failed requests, and of
the proxy's counters across the rest of the phase how many answers were cut mid-stream, how
many of those went on on another instance (migrated) and how many did not, and how many
attempts it retried (those before the first token included); the resume gap of the migrated
answers as their clients saw it; when the watch reported the process lost and when back; TTFT
and E2EL of the requests sent in the window after the fault against those sent in the same
window before it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import numpy as np

from ucmctl.bench import hitrate
from ucmctl.bench.client import RequestResult
from ucmctl.bench.scrape import fetch_metrics
from ucmctl.core import metric_names as m
from ucmctl.core.errors import UcmctlError
from ucmctl.core.exposition import samples
from ucmctl.engines.base import Metrics

ACTIONS = ("kill", "stop", "hang")  # SIGKILL, SIGTERM, SIGSTOP (ucmctl.deploy.fault sends them)
WINDOW_S = 30.0  # the requests compared: sent this long before the fault, and after
FAULT_SCRAPE_TIMEOUT_S = 5.0  # the proxy and the victim are read right at the fault: not long
_SPEC = re.compile(
    r"(?P<action>[a-z]+):(?P<process>[A-Za-z0-9][A-Za-z0-9._-]*)@(?P<at>\d+(?:\.\d+)?)(?P<unit>s|m)?"
)


@dataclass(frozen=True)
class FaultSpec:
    action: str  # a key of ACTIONS
    process: str  # a process of the deployment: decode-0, prefill-1, proxy
    at_s: float  # seconds into the measure phase

    def text(self) -> str:
        return f"{self.action}:{self.process}@{self.at_s:g}s"


def parse_fault(text: str) -> FaultSpec:
    """`kill:decode-0@30s` (or `stop:`, `hang:`, `@2m`, `@30`); a one-line error naming --fault."""
    m = _SPEC.fullmatch(text.strip())
    fix = "write ACTION:PROCESS@TIME, e.g. kill:decode-0@30s (ACTION: kill, stop or hang; TIME in s or m)"
    if m is None:
        raise UcmctlError.one(f"'{text}' is not a fault", key="--fault", fix=fix)
    if m["action"] not in ACTIONS:
        raise UcmctlError.one(f"'{m['action']}' is not an action", key="--fault", fix=fix)
    at = float(m["at"]) * (60 if m["unit"] == "m" else 1)
    if at <= 0:
        raise UcmctlError.one(f"'{text}': the time must be after the phase's start", key="--fault", fix=fix)
    return FaultSpec(m["action"], m["process"], at)


class Watched(Protocol):
    """What the report reads of the deployment's watch (ucmctl.deploy.watch.Watch)."""

    def losses_since(self, mark: float) -> list[Any]: ...

    def back_since(self, process: str, mark: float) -> float | None: ...


@dataclass
class _Fired:
    perf: float  # time.perf_counter() once the signal was sent (the requests' clock)
    mono: float  # time.monotonic() then (the watch's clock)
    was_running: bool
    proxy: dict[str, float] | None  # the proxy's samples just before
    proxy_after: dict[str, float] | None = None  # ... and just after
    sending: float = 0.0  # time.perf_counter() as the signal began to go (its command to the node)


class Fault:
    """Fires `spec` once, in the first measure phase, through `fire` (blocking: it goes to the
    node), then `report`s what it cost, once `release` (a hang's SIGCONT), where there is one,
    let the process go on (`let_go`). `proxy_urls` (the proxy, or each replica) are read for
    their counters and gauges, added up; `victim_url` is the process's own API server URL (its
    gauges in the proxies), if it has one; `ALL` when the victim is a proxy (every answer it
    streams is its own): then `victim_proxy` is its URL, whose gauges alone are read, and whose
    counters are not counted (they die with it: the other replicas' are)."""

    def __init__(
        self,
        spec: FaultSpec,
        fire: Callable[[], bool],
        *,
        release: Callable[[], bool] | None = None,
        proxy_urls: Sequence[str] = (),
        victim_url: str | None = None,
        victim_proxy: str | None = None,
        watch: Watched | None = None,
        metrics: Metrics = hitrate.METRICS,
    ) -> None:
        """`metrics`: the names the engine of the deployment's servers gives its counters."""
        self.spec = spec
        self._metrics = metrics
        self._fire = fire
        self._release = release
        self._proxies = list(proxy_urls)
        self._victim = victim_url
        self._victim_proxy = victim_proxy
        self._watch = watch
        self._fired: _Fired | None = None
        self._phase: str | None = None

    def wants(self, label: str) -> bool:
        """Whether the phase of `label` is the one this fault is for (the first measure phase)."""
        if self._phase is None and label.startswith("measure"):
            self._phase = label
        return label == self._phase

    async def during(self, http: aiohttp.ClientSession, start: float) -> None:
        """Wait until `spec.at_s` after `start` (perf_counter), then fire; cancelled when the
        phase ends first."""
        await asyncio.sleep(max(0.0, start + self.spec.at_s - time.perf_counter()))
        before = await self._proxy_samples(http)
        sending = time.perf_counter()
        was_running = await asyncio.to_thread(self._fire)
        fired = _Fired(time.perf_counter(), time.monotonic(), was_running, before, sending=sending)
        self._fired = fired
        fired.proxy_after = await self._proxy_samples(http)

    def let_go(self) -> bool:
        """Let a hung process go on (a hang's release, once; nothing for the other faults):
        whether it was running then."""
        if self._release is None or self._fired is None:
            return False
        release, self._release = self._release, None
        return release()

    async def _proxy_samples(self, http: aiohttp.ClientSession) -> dict[str, float] | None:
        """The proxies' counters (the victim proxy's left out) and the victim's gauges, added
        up; None when one that counts does not answer."""
        if not self._proxies:
            return None
        texts = await asyncio.gather(*(fetch_metrics(http, u, FAULT_SCRAPE_TIMEOUT_S) for u in self._proxies))
        out = dict.fromkeys(_COUNTERS, 0.0)
        counted = False
        for url, text in zip(self._proxies, texts, strict=True):
            victim = self._victim_proxy == url
            if text is None:
                if victim:
                    continue  # gone: its gauges were read just before
                return None
            # a proxy as victim: its gauges alone; its counts die with it (the living count)
            got = proxy_samples(text, ALL if victim else None if self._victim_proxy else self._victim)
            out.update((k, out.get(k, 0.0) + v) for k, v in got.items() if not (victim and k in _COUNTERS))
            counted = counted or not victim
        if not counted:  # no living proxy: no counts
            for key in _COUNTERS:
                del out[key]
        return out

    async def report(
        self, http: aiohttp.ClientSession, results: Sequence[RequestResult], duration: float
    ) -> dict[str, Any]:
        """What the fault cost, for the phase's summary (`fault`)."""
        spec = self.spec
        out: dict[str, Any] = {
            "spec": spec.text(),
            "action": spec.action,
            "process": spec.process,
            "at_s": spec.at_s,
        }
        fired = self._fired
        if fired is None:
            out.update(injected=False, why=f"the phase ended {duration:.0f} s in, before {spec.at_s:g} s")
            return out
        if self._release is not None:  # the phase is over: the hung process goes on
            out["released"] = await asyncio.to_thread(self.let_go)
        first = min((r.start_time for r in results), default=fired.perf)
        out.update(injected=True, into_s=round(fired.perf - first, 2), was_running=fired.was_running)
        after = await self._proxy_samples(http) if fired.proxy is not None else None
        out.update(cost_at_proxy(fired.proxy, fired.proxy_after, after))
        out["resume_gap_ms"] = resume_gaps(results, fired.perf, out["migrated"])
        out["failed"] = sum(1 for r in results if not r.ok)
        # sent once the signal began to go and failed: none while the others of its role serve;
        # all those sent while the proxy itself is down
        out["failed_sent_after"] = sum(1 for r in results if not r.ok and r.start_time >= fired.sending)
        # sent to a proxy replica that refused the connection (it was down), then to another
        out["sent_on"] = sum(1 for r in results if r.sent_on and r.start_time >= fired.sending)
        out.update(self._watched(fired))
        out["store_since_back"] = (
            await self._store_since_back(http) if out["back_after_s"] is not None else None
        )
        window = min(WINDOW_S, spec.at_s)
        out["window_s"] = window
        out["before"] = window_figures(results, fired.perf - window, fired.perf)
        out["after"] = window_figures(results, fired.perf, fired.perf + window)
        return out

    async def _store_since_back(self, http: aiohttp.ClientSession) -> dict[str, int] | None:
        """The restarted server's external (store) queries and hits, in tokens: its counters
        began again at its restart, so these are its requests since it was back."""
        if self._victim is None or self._victim == ALL:
            return None
        text = await fetch_metrics(http, self._victim, FAULT_SCRAPE_TIMEOUT_S)
        if text is None:
            return None
        counters = hitrate.parse_counters(text, self._metrics)
        return {
            "queried_tokens": int(counters["external_queries"]),
            "hit_tokens": int(counters["external_hits"]),
        }

    def _watched(self, fired: _Fired) -> dict[str, float | None]:
        if self._watch is None:
            return {"detected_after_s": None, "back_after_s": None}
        lost = [x for x in self._watch.losses_since(fired.mono) if x.process == self.spec.process]
        back = self._watch.back_since(self.spec.process, fired.mono)
        return {
            "detected_after_s": round(lost[0].at - fired.mono, 1) if lost else None,
            "back_after_s": round(back - fired.mono, 1) if back is not None else None,
        }


ALL = "*"  # the victim is the proxy: the gauges of every instance are its own
# the proxy's counters a fault is judged by
_COUNTERS = ("retries", "first_token_retries", "mid_stream", "migrated", "not_migrated")


def proxy_samples(text: str, victim: str | None) -> dict[str, float]:
    """The proxy's counters a fault is judged by, and the victim's gauges (summed over every
    instance for `ALL`), from its /metrics."""
    out = dict.fromkeys(_COUNTERS, 0.0)
    if victim == ALL:
        out.update(streaming=0.0, in_flight=0.0)
    for s in samples(text, (m.PROXY_PREFIX,)):
        name, labels, value = s.name, s.labels, s.value
        if name == m.PROXY_RETRIES:
            out["retries"] += value
        elif name == m.PROXY_FIRST_TOKEN_RETRIES:
            out["first_token_retries"] += value
        elif name == m.PROXY_ERRORS and labels.get("reason") == "upstream_mid_stream":
            out["mid_stream"] += value
        elif name == m.PROXY_MIGRATIONS and labels.get("outcome") != "cancelled":  # (its client left)
            out["migrated" if labels.get("outcome") == "resumed" else "not_migrated"] += value
        elif victim is not None and (victim == ALL or labels.get("instance") == victim):
            if name == m.PROXY_INSTANCE_STREAMING:
                out["streaming"] = out.get("streaming", 0.0) + value
            elif name == m.PROXY_INSTANCE_IN_FLIGHT:
                out["in_flight"] = out.get("in_flight", 0.0) + value
    return out


def cost_at_proxy(
    before: dict[str, float] | None, just_after: dict[str, float] | None, end: dict[str, float] | None
) -> dict[str, int | None]:
    """The victim's answers streaming and in flight when the signal went, and the proxy's counts
    from then to the phase's end: answers cut mid-stream, attempts retried, of those before the
    first token. None where the proxy was not read, or started again since (its counts died
    with it).

    The gauges are read just before the signal and just after: one that began streaming in
    between is in the later read, or already among the cuts (the larger figure is taken)."""

    def at(key: str) -> int | None:
        if before is None or key not in before:
            return None
        now = before[key]
        if just_after is not None and key in just_after and "mid_stream" in just_after:
            now = max(now, just_after[key] + just_after["mid_stream"] - before["mid_stream"])
        return int(now)

    def delta(key: str) -> int | None:
        if before is None or end is None or restarted or key not in before or key not in end:
            return None
        return int(end[key] - before[key])

    # a counter that went down: the proxy itself started again, its counts of before are gone
    restarted = (
        before is not None
        and end is not None
        and any(end[k] < before[k] for k in _COUNTERS if k in before and k in end)
    )

    return {
        "streaming_on_it": at("streaming"),
        "in_flight_on_it": at("in_flight"),
        "cut_mid_stream": delta("mid_stream"),
        "migrated": delta("migrated"),
        "not_migrated": delta("not_migrated"),
        "retried": delta("retries"),
        "retried_before_first_token": delta("first_token_retries"),
    }


def resume_gaps(results: Sequence[RequestResult], at: float, migrated: int | None) -> dict[str, Any] | None:
    """The resume gap of the answers that moved, as their clients saw it: of each answer that
    streamed across the fault (`at`, perf_counter), the time between the two tokens around it;
    the `migrated` longest of those are the moved answers' (a stream that did not move goes on
    at its own pace). p50 and p99 in ms; None where nothing moved."""
    if not migrated:
        return None
    gaps: list[float] = []
    for r in results:
        if not r.ok or not r.itl or r.start_time + r.ttft >= at:
            continue
        t = r.start_time + r.ttft
        for step in r.itl:
            if t + step > at:
                gaps.append(step)
                break
            t += step
    moved = np.asarray(sorted(gaps)[-migrated:]) * 1000.0
    if not len(moved):
        return None
    p50, p99 = np.percentile(moved, 50), np.percentile(moved, 99)
    return {"answers": len(moved), "p50": round(float(p50), 1), "p99": round(float(p99), 1)}


def window_figures(results: Sequence[RequestResult], begin: float, end: float) -> dict[str, Any]:
    """Requests sent in [begin, end): how many, how many failed, TTFT and E2EL (ms) of the rest."""
    sent = [r for r in results if begin <= r.start_time < end]
    ok = [r for r in sent if r.ok]
    out: dict[str, Any] = {"requests": len(sent), "failed": len(sent) - len(ok)}
    for key, values in (("ttft", [r.ttft for r in ok]), ("e2el", [r.latency for r in ok])):
        ms = np.asarray(values) * 1000.0
        out[f"mean_{key}_ms"] = round(float(ms.mean()), 2) if len(ms) else None
        out[f"p50_{key}_ms"] = round(float(np.percentile(ms, 50)), 2) if len(ms) else None
        out[f"p99_{key}_ms"] = round(float(np.percentile(ms, 99)), 2) if len(ms) else None
    return out


def fault_lines(name: str, f: dict[str, Any]) -> list[str]:
    """The fault as `bench` prints it: a few lines, each under 80 columns for a short name."""
    if not f.get("injected"):
        return [f"{name}: fault {f['spec']} not injected: {f.get('why', '')}"]
    was = "" if f.get("was_running") else f" ({f['process']} was not running)"
    lines = [f"{name}: fault {f['spec']} sent {f['into_s']:.1f} s in{was}"]
    if "released" in f:
        lines[0] += "; let go at the phase's end"

    def n(key: str) -> str:
        return "?" if f.get(key) is None else str(f[key])

    lines.append(f"  streaming from it then {n('streaming_on_it')} (in flight {n('in_flight_on_it')})")
    lines.append(f"  failed {f['failed']} ({n('failed_sent_after')} of them sent after it)")
    if f.get("sent_on"):
        lines.append(f"  {f['sent_on']} sent on to another proxy when theirs refused the connection")
    lines.append(
        f"  at the proxy: cut mid-stream {n('cut_mid_stream')}, retried {n('retried')} "
        f"({n('retried_before_first_token')} before the first token)"
    )
    if f.get("cut_mid_stream"):
        gap = f.get("resume_gap_ms")
        gaps = f"; resume gap p50 {gap['p50']:.0f} p99 {gap['p99']:.0f} ms" if gap else ""
        lines.append(f"  moved to another instance {n('migrated')}, not {n('not_migrated')}{gaps}")
    seen, back = f.get("detected_after_s"), f.get("back_after_s")
    lines.append(
        "  "
        + (f"reported lost {seen:.1f} s after" if seen is not None else "not reported lost")
        + "; "
        + (f"back in {back:.1f} s" if back is not None else "not back")
    )
    store = f.get("store_since_back")
    if store is not None:
        lines.append(
            f"  since back: {store['hit_tokens']} of {store['queried_tokens']} prompt tokens from the store"
        )
    w = f["window_s"]
    for side in ("before", "after"):
        s = f[side]
        lines.append(
            f"  {w:g} s {side}: {s['requests']} sent, {s['failed']} failed; TTFT p50 "
            f"{_ms(s['p50_ttft_ms'])} p99 {_ms(s['p99_ttft_ms'])}; E2EL p50 {_ms(s['p50_e2el_ms'])} ms"
        )
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
