"""The phase engine every workload runs on: the run's settings (`BenchConfig`), its target, one
phase sent and summarized (`measure`: latencies, measured hit rates, goodput, handover, series,
losses, fault) as a typed phase, and what a server says of itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import aiohttp

from ucmctl.bench import client, goodput, handover, hitrate, metrics, paths, prompts
from ucmctl.bench.client import RequestResult
from ucmctl.bench.fault import Fault
from ucmctl.bench.hitrate import Instance
from ucmctl.bench.results import Phase
from ucmctl.bench.scrape import SCRAPE_TIMEOUT_S, fetch_metrics
from ucmctl.bench.series import Sampler
from ucmctl.engines import DEFAULT_ENGINE, engine_for
from ucmctl.engines.base import Metrics


@dataclass
class BenchConfig:
    """A run's settings, whatever its workload (whose own parameters are its spec's)."""

    concurrency: int = 128
    output_len: int = 1000
    request_rate: float = math.inf
    ignore_eos: bool = True
    seed: int = 0
    vocab: int = 8000
    model: str | None = None
    temperature: float | None = None
    settle_s: float = 0.0  # pause between the phases (an asynchronous store finishing its writes)
    timeout_s: float = 6 * 3600
    stream_base: int = 0  # offsets the prompts' stream numbers (a suite gives each cell its own)
    goodput: dict[str, float] = field(default_factory=dict)  # SLOs in ms: ttft, tpot, e2el
    block_size: int = 16  # the servers' KV block, for the workloads' ideal hit rates
    fail_fast: bool = False  # with a watched deployment: stop at the first process lost
    cache_salt: str | None = None  # in every request: this run's blocks are its own (None: unsalted)
    sample_interval_s: float = 1.0  # every instance's /metrics read this often in a phase (0: never)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["request_rate"] = "inf" if math.isinf(self.request_rate) else self.request_rate
        return d


@dataclass
class Target:
    url: str  # where requests go: the proxy, or one API server
    instances: list[Instance] = field(default_factory=list)  # whose /metrics are read
    endpoint: str = "/v1/completions"
    watch: Watched | None = None  # the deployment's processes, looked at while phases run
    fault: Fault | None = None  # injected into the first measure phase (bench --fault)
    engine: str = DEFAULT_ENGINE  # the engine serving there: the metric names its /metrics uses
    more_urls: list[str] = field(default_factory=list)  # other front doors (proxy replicas): in turn

    @property
    def urls(self) -> list[str]:
        """Every front door, `url` first: requests go to each in turn."""
        return [self.url, *self.more_urls]

    @property
    def metrics(self) -> Metrics:
        return engine_for(self.engine).metrics


class Watched(Protocol):
    """What a phase needs of a deployment's watch (ucmctl.deploy.watch.Watch)."""

    lost_one: threading.Event

    def begin(self, phase: str) -> float: ...

    def end(self) -> None: ...

    def losses_since(self, mark: float) -> list[Any]: ...


class Progress(Protocol):
    def start(self, label: str, total: int) -> None: ...

    def advance(self, result: RequestResult) -> None: ...

    def stop(self) -> None: ...


class NoProgress:
    def start(self, label: str, total: int) -> None:
        pass

    def advance(self, result: RequestResult) -> None:
        pass

    def stop(self) -> None:
        pass


async def detect_model(http: aiohttp.ClientSession, url: str) -> str | None:
    """The first served model name, from /v1/models; None when the endpoint has none."""
    try:
        async with http.get(f"{url}/v1/models", timeout=aiohttp.ClientTimeout(total=15)) as r:
            if r.status == 200:
                data = (await r.json()).get("data") or []
                return str(data[0]["id"]) if data else None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError, TypeError):
        pass
    return None


@dataclass
class ServerFacts:
    """What a server says of its model at /v1/models (vLLM and the simulator both say it)."""

    model: str | None = None  # the served name
    root: str | None = None  # the model's path as the server was given it
    max_model_len: int | None = None


async def server_facts(urls: list[str]) -> ServerFacts:
    """The first answer among `urls`' /v1/models (a proxy, then its servers); empty when none."""
    async with aiohttp.ClientSession() as http:
        for url in urls:
            try:
                async with http.get(f"{url}/v1/models", timeout=aiohttp.ClientTimeout(total=15)) as r:
                    if r.status != 200:
                        continue
                    data = (await r.json()).get("data") or []
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, AttributeError):
                continue
            if data and isinstance(data[0], dict):
                first = data[0]
                length = first.get("max_model_len")
                return ServerFacts(
                    str(first["id"]) if first.get("id") else None,
                    str(first["root"]) if first.get("root") else None,
                    length if isinstance(length, int) and length > 0 else None,
                )
    return ServerFacts()


async def vocabulary_refused(url: str, vocab: int, model: str | None) -> str | None:
    """Send one two-token prompt that holds the highest id the benchmark will use (vocab - 1);
    the server's message when it refuses that id as out of its vocabulary, else None (also
    when it fails otherwise: the phases count and report that)."""
    body = client.make_body([prompts.FIRST_ID, vocab - 1], 1, model, True, None)
    try:
        timeout = aiohttp.ClientTimeout(total=120)
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, data=body, headers=client.HEADERS, timeout=timeout) as r,
        ):
            text = await r.text(errors="replace")
            status = r.status
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None
    if status == 200 or "vocab" not in text.lower():
        return None
    try:
        message = json.loads(text).get("error", {}).get("message") or text
    except (ValueError, AttributeError):
        message = text
    return " ".join(str(message).split())[:200]


async def measure(
    http: aiohttp.ClientSession,
    cfg: BenchConfig,
    target: Target,
    label: str,
    bodies: Sequence[bytes] | client.BodyFactory,
    prompt_lens: Sequence[int],
    progress: Progress,
    *,
    schedule: Sequence[float] | None = None,
    collect_tokens: bool = False,
) -> Phase:
    """One phase of any workload: send, then summarize under vLLM's key names, with the measured
    hit rates and preemptions (counter deltas across the phase) and the goodput when asked; its
    requests kept (`Phase.requests`) for the runner."""
    watch = target.watch
    if watch is not None and cfg.fail_fast:
        _fail_fast(watch)  # lost between the phases
    fault = target.fault if target.fault is not None and target.fault.wants(label) else None
    before = await hitrate.scrape(http, target.instances, target.metrics)
    # ucmctl's proxy (a deployment's target) measures the KV handover; a server is not asked
    proxies = target.urls if target.url not in {i.url for i in target.instances} else []
    at_proxy = await _proxy_reading(http, proxies)
    mark = watch.begin(label) if watch is not None else 0.0
    progress.start(label, len(prompt_lens))
    firing: asyncio.Future[None] | None = None
    sampling = cfg.sample_interval_s > 0 and target.instances
    sampler = Sampler(http, target.instances, cfg.sample_interval_s, target.metrics) if sampling else None
    series = None
    if sampler is not None:
        sampler.start()
    try:
        if fault is not None:
            firing = asyncio.ensure_future(fault.during(http, time.perf_counter()))
        sending = asyncio.ensure_future(
            client.run_phase(
                http,
                [u + target.endpoint for u in target.urls],
                bodies,
                prompt_lens,
                cfg.concurrency,
                cfg.request_rate,
                cfg.seed,
                progress.advance,
                schedule=schedule,
                collect_tokens=collect_tokens,
            )
        )
        run = await (_unless_lost(sending, watch) if watch is not None and cfg.fail_fast else sending)
    finally:
        if sampler is not None:
            series = await sampler.stop()
        progress.stop()
        if watch is not None:
            watch.end()
        if firing is not None and not firing.done():  # the phase ended before the fault's time
            firing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await firing
    if firing is not None and not firing.cancelled() and firing.exception() is not None:
        raise firing.exception()  # type: ignore[misc]  # the signal could not be sent: said as it is
    after = await hitrate.scrape(http, target.instances, target.metrics)
    summary = metrics.summarize(run.results, run.duration)
    if cfg.goodput:
        summary.update(goodput.goodput_fields(run.results, run.duration, cfg.goodput))
    summary["num_prompts"] = len(prompt_lens)
    summary["hit_rate"] = hitrate.hit_rates(target.instances, before, after)
    summary.update(_proxy_figures(at_proxy, await _proxy_reading(http, proxies)))
    if series is not None:
        summary["series"] = series
    if watch is not None:  # the processes found dead or unhealthy while this phase ran
        summary["lost"] = [loss.as_dict() for loss in watch.losses_since(mark)]
    if fault is not None:
        summary["fault"] = await fault.report(http, run.results, run.duration)
    return phase_of(summary, run.results)


def phase_of(summary: dict[str, Any], requests: list[RequestResult]) -> Phase:
    """A phase from its figures (in their order) and the requests they summarize."""
    phase = Phase.model_validate(summary)
    phase._requests = requests
    return phase


Reading = dict[str, tuple[Any, Any]]  # per proxy URL: (its handover histogram, its path counts)


async def _proxy_reading(http: aiohttp.ClientSession, proxies: list[str]) -> Reading | None:
    """What ucmctl's proxies (the proxy, or each replica) count: the KV handover and the paths
    requests took, one read of each one's /metrics (a proxy that does not answer: not in it)."""
    if not proxies:
        return None
    texts = await asyncio.gather(*(fetch_metrics(http, u, SCRAPE_TIMEOUT_S) for u in proxies))
    return {
        u: (handover.parse(t), paths.parse(t)) for u, t in zip(proxies, texts, strict=True) if t is not None
    }


def _proxy_figures(before: Reading | None, after: Reading | None) -> dict[str, Any]:
    """The phase's KV handover and paths, where the proxies measured them: of those read at both
    ends (a replica that died meanwhile took its counts with it), added up."""
    if before is None or after is None:
        return {}
    both = [u for u in before if u in after]
    if not both:
        return {}
    out: dict[str, Any] = {}
    figures = handover.phase_figures(
        handover.merged([before[u][0] for u in both]), handover.merged([after[u][0] for u in both])
    )
    if figures is not None:
        out["kv_handover"] = figures
    took = paths.phase_counts(
        paths.merged([before[u][1] for u in both]), paths.merged([after[u][1] for u in both])
    )
    if took is not None:
        out["paths"] = took
    return out


async def _unless_lost(sending: asyncio.Future[Any], watch: Watched) -> Any:
    """The phase's outcome, or, once the watch has lost a process, the phase cancelled and
    the loss raised (--fail-fast)."""
    while True:
        done, _ = await asyncio.wait({sending}, timeout=0.2)
        if done:
            return sending.result()
        if watch.lost_one.is_set():
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending
            _fail_fast(watch)


def _fail_fast(watch: Watched) -> None:
    if watch.lost_one.is_set():
        from ucmctl.core.errors import ExitStatus, UcmctlError

        first = watch.losses_since(0.0)[0]
        raise UcmctlError.one(
            f"stopped at once (--fail-fast): {first.line()}",
            status=ExitStatus.FAILURE,
            fix="see its last log lines with `ucmctl logs`; run without --fail-fast to go on without it",
        )


def model_path_of(plan: Any) -> str | None:
    """The model folder the deployment's API servers were given (`vllm serve PATH` or `ucmctl
    sim serve PATH`), as the nodes see it."""
    for p in plan.processes:
        if p.is_server and "serve" in p.argv:
            i = p.argv.index("serve") + 1
            if i < len(p.argv) and not p.argv[i].startswith("-"):
                return str(p.argv[i])
    return None


def target_from_deployment(deployment: str) -> Target:
    """Requests go to the proxy (or the only API server); every API server's /metrics is read."""
    from ucmctl.deploy.state import endpoints

    ep = endpoints(deployment)
    instances = [Instance(name, role, url) for name, role, url in ep.instances]
    doors = [u.rstrip("/") for u in ep.proxies] or ([instances[0].url] if len(instances) == 1 else [])
    if not doors:
        from ucmctl.core.errors import UcmctlError

        raise UcmctlError.one(
            f"deployment '{deployment}' has no proxy and {len(instances)} API servers",
            fix="pass --url to pick the server to load",
        )
    return Target(doors[0], instances, more_urls=doors[1:])
