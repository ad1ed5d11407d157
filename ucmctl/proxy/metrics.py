"""The proxy's Prometheus metrics, kept as plain numbers and written out as text on scrape."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable

from ucmctl.proxy.balancer import Instance

PREFIX = "ucmctl_proxy_"
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


# The KV handover is milliseconds to seconds: 25% steps from 0.5 ms to ~60 s, so that a quantile
# read from the buckets is within a step of the truth.
HANDOVER_BUCKETS = tuple(round(0.0005 * 1.25**i, 6) for i in range(53))


class Histogram:
    """A cumulative Prometheus histogram over fixed upper bounds."""

    def __init__(self, buckets: Iterable[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last slot is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Add one observation."""
        # bisect_left: a value equal to a bound belongs to that bucket (le = less or equal)
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        """The _bucket, _sum and _count samples of this histogram."""
        sep = "," if labels else ""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(f'{name}_bucket{{{labels}{sep}le="{_num(bound)}"}} {running}')
        tail = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_sum{tail} {_num(self.sum)}")
        out.append(f"{name}_count{tail} {self.count}")
        return out


class Metrics:
    """Every counter and histogram the proxy keeps."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()  # by route
        self.errors: Counter[str] = Counter()  # by reason
        self.retries: Counter[str] = Counter()  # by leg
        self.first_token_retries: Counter[str] = Counter()  # by leg: the upstream died before its first token
        self.ttft = Histogram()
        self.latency = Histogram()
        self.prefill = Histogram()
        self.kv_handover = Histogram(HANDOVER_BUCKETS)

    def render(self, instances: Iterable[Instance], deployment: str | None = None) -> str:
        """The Prometheus text exposition of everything, instance gauges included."""
        out: list[str] = []

        def family(name: str, kind: str, help_: str) -> str:
            full = PREFIX + name
            out.append(f"# HELP {full} {help_}")
            out.append(f"# TYPE {full} {kind}")
            return full

        def counter(name: str, help_: str, label: str, values: Counter[str]) -> None:
            full = family(name, "counter", help_)
            for key in sorted(values):
                out.append(f'{full}{{{label}="{escape(key)}"}} {values[key]}')

        counter("requests_total", "Requests received, by route.", "route", self.requests)
        counter("errors_total", "Requests that failed, by reason.", "reason", self.errors)
        counter(
            "retries_total", "Upstream attempts retried on another instance, by leg.", "leg", self.retries
        )
        counter(
            "first_token_retries_total",
            "Answers sent again on another instance because the upstream failed before its first token.",
            "leg",
            self.first_token_retries,
        )
        for name, hist, help_ in (
            ("ttft_seconds", self.ttft, "Time from request to first streamed byte sent to the client."),
            ("request_latency_seconds", self.latency, "Time from request to the end of the response."),
            ("prefill_seconds", self.prefill, "Time of the prefill leg, retries included."),
            (
                "kv_handover_seconds",
                self.kv_handover,
                "PD, streamed answers: from the prefill leg's "
                "answer to the decode leg's first streamed bytes (the KV handover, retries included).",
            ),
        ):
            out.extend([f"# HELP {PREFIX}{name} {help_}", f"# TYPE {PREFIX}{name} histogram"])
            out.extend(hist.lines(PREFIX + name))
        insts = list(instances)
        per_instance = (
            (
                "instance_healthy",
                "gauge",
                "1 while the instance answers its health checks.",
                lambda i: int(i.healthy),
            ),
            (
                "instance_draining",
                "gauge",
                "1 while it is drained (out of routing on purpose).",
                lambda i: int(i.draining),
            ),
            ("instance_requests_in_flight", "gauge", "Requests in flight.", lambda i: i.requests),
            (
                "instance_requests_streaming",
                "gauge",
                "Requests in flight whose first token went to the client.",
                lambda i: i.streaming,
            ),
            (
                "instance_tokens_in_flight",
                "gauge",
                "Prompt tokens of the requests in flight.",
                lambda i: i.tokens,
            ),
            ("instance_requests_total", "counter", "Requests sent.", lambda i: i.requests_total),
            (
                "instance_failures_total",
                "counter",
                "Failed requests and health checks.",
                lambda i: i.failures_total,
            ),
            (
                "instance_output_chunks_total",
                "counter",
                "Streamed chunks relayed.",
                lambda i: i.output_chunks_total,
            ),
        )
        for name, kind, help_, value in per_instance:
            full = family(name, kind, help_)
            for inst in insts:
                out.append(f'{full}{{instance="{escape(inst.url)}",role="{inst.role}"}} {value(inst)}')
        if deployment:
            full = family("info", "gauge", "The deployment this proxy fronts.")
            out.append(f'{full}{{deployment="{escape(deployment)}"}} 1')
        out.append("")
        return "\n".join(out)


def escape(value: str) -> str:
    """A label value escaped as the text format requires."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if not float(value).is_integer() else f"{value:.1f}"
