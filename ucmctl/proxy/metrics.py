"""The proxy's Prometheus metrics, kept as plain numbers and written out as text on scrape."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from ucmctl.core import metric_names as names
from ucmctl.core.histogram import Histogram
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.tokenize import OUTCOMES as TOKENIZE_OUTCOMES

__all__ = ["HANDOVER_BUCKETS", "LATENCY_BUCKETS", "Histogram", "Metrics", "escape"]

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)


# The KV handover is milliseconds to seconds: 25% steps from 0.5 ms to ~60 s, so that a quantile
# read from the buckets is within a step of the truth.
HANDOVER_BUCKETS = tuple(round(0.0005 * 1.25**i, 6) for i in range(53))


# what a feed's stats count (kv_feed.FeedStats) -> the outcome label of its events
_EVENT_OUTCOMES = {"events": "applied", "bad": "bad", "gaps": "gap", "unknown_parent": "unknown_parent"}


def _kv_event_lines(feeds: object, family: Callable[[str, str, str], None]) -> list[str]:
    """The KV-cache events each instance's feed read, by outcome (none without feeds)."""
    if not isinstance(feeds, list) or not feeds:
        return []
    help_ = (
        "vLLM KV-cache events read per instance: applied, bad (skipped), gap (batches missed: the "
        "instance then holds nothing), unknown_parent."
    )
    family(names.PROXY_KV_EVENTS, "counter", help_)
    return [
        f'{names.PROXY_KV_EVENTS}{{instance="{escape(f["url"])}",outcome="{label}"}} {f[key]}'
        for f in feeds
        for key, label in _EVENT_OUTCOMES.items()
    ]


def _predicted_lines(predicted: object, family: Callable[[str, str, str], None]) -> list[str]:
    """kv: the prompt tokens each instance computed and how many of them the policy expected it
    to take from its own cache and from the store (vLLM's prefix-cache queries and hits)."""
    if not isinstance(predicted, dict) or not predicted:
        return []
    help_ = (
        "kv: prompt tokens of the legs sent to each instance (prompt), and of them the ones the "
        "policy expected in its own cache (local) and in the store (external)."
    )
    family(names.PROXY_KV_PREDICTED, "counter", help_)
    return [
        f'{names.PROXY_KV_PREDICTED}{{instance="{escape(url)}",kind="{kind}"}} {p[kind]}'
        for url, p in sorted(predicted.items())
        for kind in ("prompt", "local", "external")
    ]


def _tokenize_lines(tokenization: object, family: Callable[[str, str, str], None]) -> list[str]:
    """Text prompts' /tokenize asks, by outcome (none where the proxy does not tokenize)."""
    if not isinstance(tokenization, dict) or "exact" not in tokenization:
        return []
    help_ = "Text prompts sent to an instance's /tokenize, by outcome: exact, refused, failed, no_endpoint."
    family(names.PROXY_TOKENIZE, "counter", help_)
    return [f'{names.PROXY_TOKENIZE}{{outcome="{k}"}} {tokenization[k]}' for k in TOKENIZE_OUTCOMES]


class Metrics:
    """Every counter and histogram the proxy keeps."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()  # by route
        self.errors: Counter[str] = Counter()  # by reason
        self.retries: Counter[str] = Counter()  # by leg
        self.first_token_retries: Counter[str] = Counter()  # by leg: the upstream died before its first token
        self.paths: Counter[str] = (
            Counter()
        )  # pd: disaggregated (prefill, then decode) or direct (decode alone)
        # answers cut mid-stream, by (outcome, cause): cause "failure" (the upstream broke),
        # "drain" (moved off an instance drained for a restart) or "stall" (its instance stopped
        # sending tokens: proxy/stall)
        self.migrations: Counter[tuple[str, str]] = Counter()
        self.ttft = Histogram(LATENCY_BUCKETS)
        self.latency = Histogram(LATENCY_BUCKETS)
        self.prefill = Histogram(LATENCY_BUCKETS)
        self.kv_handover = Histogram(HANDOVER_BUCKETS)
        self.migration_gap = Histogram(HANDOVER_BUCKETS)

    def render(
        self,
        instances: Iterable[Instance],
        deployment: str | None = None,
        routing: dict[str, object] | None = None,
    ) -> str:
        """The Prometheus text exposition of everything, instance gauges included; `routing`:
        the policy's own words (`Policy.describe()`)."""
        out: list[str] = []

        def family(name: str, kind: str, help_: str) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")

        for name, help_, label, values in (
            (names.PROXY_REQUESTS, "Requests received, by route.", "route", self.requests),
            (names.PROXY_ERRORS, "Requests that failed, by reason.", "reason", self.errors),
            (names.PROXY_RETRIES, "Upstream attempts retried on another instance, by leg.", "leg",
             self.retries),
            (names.PROXY_FIRST_TOKEN_RETRIES, "Answers sent again on another instance because the upstream "
             "failed before its first token.", "leg", self.first_token_retries),
            (names.PROXY_PATHS, "PD requests by the path they took: disaggregated (a prefill leg, then "
             "decode), direct (one instance prefilled and decoded it: few tokens to compute on the "
             "decode instance, or every request with roles per request) or "
             "direct_saturated (every prefill instance was busy).", "path", self.paths),
        ):  # fmt: skip
            family(name, "counter", help_)
            out.extend(f'{name}{{{label}="{escape(key)}"}} {values[key]}' for key in sorted(values))
        family(
            names.PROXY_MIGRATIONS,
            "counter",
            "Streamed answers cut mid-stream, by outcome: resumed "
            "(they went on on another instance), failed (no instance took the continuation), "
            "not_continued (it cannot go on faithfully, or moved too often), cancelled (its client "
            "went away while it moved: the continuation is stopped); and by cause: failure "
            "(the upstream broke), drain (moved off an instance drained for a restart) or stall "
            "(its instance sent no token for the stall timeout).",
        )
        out.extend(f'{names.PROXY_MIGRATIONS}{{outcome="{o}",cause="{c}"}} {n}'
                   for (o, c), n in sorted(self.migrations.items()))  # fmt: skip
        for name, hist, help_ in (
            (names.PROXY_TTFT, self.ttft, "Time from request to first streamed byte sent to the client."),
            (names.PROXY_REQUEST_LATENCY, self.latency, "Time from request to the end of the response."),
            (names.PROXY_PREFILL, self.prefill, "Time of the prefill leg, retries included."),
            (names.PROXY_KV_HANDOVER, self.kv_handover, "PD, streamed answers: from the prefill leg's "
             "answer to the decode leg's first streamed bytes (the KV handover, retries included)."),
            (names.PROXY_MIGRATION_GAP, self.migration_gap, "Answers that moved mid-stream: from the last "
             "bytes sent before the failure to the continuation's first bytes."),
        ):  # fmt: skip
            family(name, "histogram", help_)
            out.extend(hist.lines(name))
        insts = list(instances)
        for name, kind, help_, value in PER_INSTANCE:
            family(name, kind, help_)
            for inst in insts:
                out.append(f'{name}{{instance="{escape(inst.url)}",role="{inst.role}"}} {value(inst)}')
        if routing:
            index = str(routing.get("index", "none"))
            family(names.PROXY_ROUTING, "gauge", "The routing policy, and where it learns where the KV is.")
            policy = escape(str(routing["policy"]))
            out.append(f'{names.PROXY_ROUTING}{{policy="{policy}",index="{escape(index)}"}} 1')
            if "blocks" in routing:
                family(names.PROXY_KV_INDEX_BLOCKS, "gauge", "Prompt blocks the proxy's index knows of.")
                out.append(f"{names.PROXY_KV_INDEX_BLOCKS} {routing['blocks']}")
            out.extend(_kv_event_lines(routing.get("kv_events"), family))
            out.extend(_predicted_lines(routing.get("predicted"), family))
            out.extend(_tokenize_lines(routing.get("tokenization"), family))
        if deployment:
            family(names.PROXY_INFO, "gauge", "The deployment this proxy fronts.")
            out.append(f'{names.PROXY_INFO}{{deployment="{escape(deployment)}"}} 1')
        out.append("")
        return "\n".join(out)


# Each instance's series: name, kind, help, value.
PER_INSTANCE: tuple[tuple[str, str, str, Callable[[Instance], int]], ...] = (
    (names.PROXY_INSTANCE_HEALTHY, "gauge", "1 while the instance answers its health checks.",
     lambda i: int(i.healthy)),
    (names.PROXY_INSTANCE_DRAINING, "gauge", "1 while it is drained (out of routing on purpose).",
     lambda i: int(i.draining)),
    (names.PROXY_INSTANCE_STALLED, "gauge", "1 while it is out of routing for a stall: it streamed no "
     "token for the stall timeout, and has not answered a one-token probe since.", lambda i: int(i.stalled)),
    (names.PROXY_INSTANCE_STALLS, "counter", "Times it stalled (its streams were cut then).",
     lambda i: i.stalls_total),
    (names.PROXY_INSTANCE_IN_FLIGHT, "gauge", "Requests in flight.", lambda i: i.requests),
    (names.PROXY_INSTANCE_STREAMING, "gauge", "Requests in flight whose first token went to the client.",
     lambda i: i.streaming),
    (names.PROXY_INSTANCE_TOKENS, "gauge", "Prompt tokens of the requests in flight.", lambda i: i.tokens),
    (names.PROXY_INSTANCE_REQUESTS, "counter", "Requests sent.", lambda i: i.requests_total),
    (names.PROXY_INSTANCE_FAILURES, "counter", "Failed requests and health checks.",
     lambda i: i.failures_total),
    (names.PROXY_INSTANCE_OUTPUT_CHUNKS, "counter", "Streamed chunks relayed.",
     lambda i: i.output_chunks_total),
)  # fmt: skip


def escape(value: str) -> str:
    """A label value escaped as the text format requires."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
