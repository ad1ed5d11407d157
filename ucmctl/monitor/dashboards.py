"""The Grafana dashboards of a deployment: every panel a PromQL query (or several) over the
series vLLM, the UCM connector, ucmctl's proxy and Mooncake export, filtered by the `deployment`
label the scrape config gives every target. `PANELS` is also what the tests query a real
Prometheus with: every panel must return data from a running deployment."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ucmctl.core import metric_names as names

D = '{deployment="$deployment"}'  # every query's selector (Grafana's variable)


def _d(extra: str = "") -> str:
    return '{deployment="$deployment"' + (f",{extra}" if extra else "") + "}"


def _quantiles(metric: str, by: str) -> list[tuple[str, str]]:
    return [
        (
            f"p{int(q * 100)} {{{{{by}}}}}",
            f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{D}[1m])))",
        )
        for q in (0.5, 0.99)
    ]


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str  # Grafana's unit id
    queries: tuple[tuple[str, str], ...]  # (legend, PromQL)
    dashboard: str  # "serving" or "kv-cache"


def _rate_ratio(hits: str, queries: str, by: str) -> str:
    """The ratio of two counters' rates (names without `_total`)."""
    return f"sum by ({by}) (rate({hits}_total{D}[1m])) / sum by ({by}) (rate({queries}_total{D}[1m]))"


def _ucm(field: str) -> str:
    """The UCM connector's counter of stats field `field`, as exposed."""
    return names.ucm_counter(field) + "_total"


PANELS = (
    Panel("TTFT by role", "s", tuple(_quantiles(names.TIME_TO_FIRST_TOKEN, "role")), "serving"),
    Panel("TPOT (inter-token latency) by role", "s",
          tuple(_quantiles(names.INTER_TOKEN_LATENCY, "role")), "serving"),
    Panel("E2E latency by role", "s", tuple(_quantiles(names.E2E_REQUEST_LATENCY, "role")),
          "serving"),
    Panel("Requests running and waiting", "short", (
        ("running {{process}}", f"sum by (process) ({names.REQUESTS_RUNNING}{D})"),
        ("waiting {{process}}", f"sum by (process) ({names.REQUESTS_WAITING}{D})"),
    ), "serving"),
    Panel("KV cache usage", "percentunit", (
        ("{{process}}", f"max by (process) ({names.KV_CACHE_USAGE}{D})"),
    ), "serving"),
    Panel("Preemptions per second", "short", (
        ("{{process}}", f"sum by (process) (rate({names.PREEMPTIONS}_total{D}[1m]))"),
    ), "serving"),
    Panel("Proxy: retries and upstream errors per second", "short", (
        ("retries {{leg}}", f"sum by (leg) (rate({names.PROXY_RETRIES}{D}[1m]))"),
        ("before the first token {{leg}}",
         f"sum by (leg) (rate({names.PROXY_FIRST_TOKEN_RETRIES}{D}[1m]))"),
        ("errors {{reason}}", f"sum by (reason) (rate({names.PROXY_ERRORS}{D}[1m]))"),
        ("requests", f"sum(rate({names.PROXY_REQUESTS}{D}[1m]))"),
    ), "serving"),
    Panel("Proxy: KV handover (prefill answered to decode's first token)", "s",
          tuple(_quantiles(names.PROXY_KV_HANDOVER, "deployment")), "serving"),
    Panel("Local prefix cache hit rate by role", "percentunit", (
        ("{{role}}", _rate_ratio(names.PREFIX_CACHE_HITS, names.PREFIX_CACHE_QUERIES, "role")),
    ), "kv-cache"),
    Panel("External (UCM store, P2P) hit rate by role", "percentunit", (
        ("{{role}}", _rate_ratio(names.EXTERNAL_PREFIX_CACHE_HITS, names.EXTERNAL_PREFIX_CACHE_QUERIES,
                                 "role")),
    ), "kv-cache"),
    Panel("UCM store: blocks loaded and saved per second", "short", (
        ("load {{process}}", f"sum by (process) (rate({_ucm('load_blocks')}{D}[1m]))"),
        ("save {{process}}", f"sum by (process) (rate({_ucm('save_blocks')}{D}[1m]))"),
    ), "kv-cache"),
    Panel("UCM store: bytes loaded and saved per second", "Bps", (
        ("load {{process}}", f"sum by (process) (rate({_ucm('load_bytes')}{D}[1m]))"),
        ("save {{process}}", f"sum by (process) (rate({_ucm('save_bytes')}{D}[1m]))"),
    ), "kv-cache"),
    Panel("UCM store: seconds per block", "s", (
        ("load {{process}}", f"sum by (process) (rate({_ucm('load_s')}{D}[5m])) / "
                             f"sum by (process) (rate({_ucm('load_blocks')}{D}[5m]))"),
        ("save {{process}}", f"sum by (process) (rate({_ucm('save_s')}{D}[5m])) / "
                             f"sum by (process) (rate({_ucm('save_blocks')}{D}[5m]))"),
    ), "kv-cache"),
    Panel("UCM store: errors per second (a miss is recomputed)", "short", tuple(
        (f"{op} {{{{process}}}}", f"sum by (process) (rate({_ucm(f'{op}_errors')}{D}[1m]))")
        for op in ("load", "save", "lookup")
    ), "kv-cache"),
    Panel("KV moved point to point (Mooncake, P2P) and Mooncake master", "short", (
        ("tokens/s into {{process}}", f"sum by (process) (rate({names.PROMPT_TOKENS_BY_SOURCE}_total"
                                      + _d(f'source="{names.KV_TRANSFER_SOURCE}"') + "[1m]))"),
        ("master up", "up" + _d('role="mooncake"')),
    ), "kv-cache"),
)  # fmt: skip

TITLES = {"serving": "serving: latency, load, proxy", "kv-cache": "KV cache: hits, UCM store, transfers"}


def dashboard(deployment: str, which: str) -> dict[str, Any]:
    """A Grafana dashboard (JSON model) of the panels of `which`, for `deployment` (its
    `$deployment` variable, read from the `up` series, defaults to it)."""
    panels = []
    for i, p in enumerate(x for x in PANELS if x.dashboard == which):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": p.title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"x": 12 * (i % 2), "y": 8 * (i // 2), "w": 12, "h": 8},
                "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                "targets": [
                    {"refId": chr(65 + k), "expr": expr, "legendFormat": legend}
                    for k, (legend, expr) in enumerate(p.queries)
                ],
            }
        )
    return {
        "title": f"ucmctl {deployment}: {TITLES[which]}",
        "uid": f"ucmctl-{which}-{deployment}"[:40],
        "tags": ["ucmctl", "vllm", "ucm"],
        "timezone": "browser",
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "schemaVersion": 39,
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {
                    "name": "deployment",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": 'label_values(up{job=~"ucmctl-.*"}, deployment)',
                    "current": {"text": deployment, "value": deployment},
                },
            ]
        },
        "panels": panels,
    }


def dashboards(deployment: str) -> dict[str, str]:
    """File name: JSON text, one per dashboard."""
    return {
        f"ucmctl-{deployment}-{which}.json": json.dumps(dashboard(deployment, which), indent=1) + "\n"
        for which in TITLES
    }
