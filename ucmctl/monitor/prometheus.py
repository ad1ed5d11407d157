"""`ucmctl render TOPOLOGY --prometheus DIR`: a Prometheus scrape config whose targets come from
a file (file-based service discovery: the file can be rewritten for a changed deployment without
touching the config), one target per `/metrics` endpoint of the plan (API servers, the proxy, the
Mooncake master), labelled with deployment, role, process and node; alert rules for the known
pitfalls; and Grafana dashboards (dashboards.py).

The folder is ucmctl's: a manifest lists what it wrote, and a folder holding anything else is
refused, so a render never overwrites a file of the user's."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from ucmctl.core import metric_names as names
from ucmctl.core.errors import UcmctlError
from ucmctl.monitor.dashboards import dashboards
from ucmctl.plan.model import Plan

MANIFEST = ".ucmctl-prometheus"
METRIC_ROLES = ("prefill", "decode", "mixed", "proxy", "mooncake")  # processes that serve /metrics


def targets(plan: Plan) -> list[dict[str, object]]:
    """File-SD entries: one per process with a /metrics endpoint, as the control machine (where
    Prometheus runs beside ucmctl) reaches it."""
    out: list[dict[str, object]] = []
    for p in plan.processes:
        if p.role not in METRIC_ROLES or not p.url:
            continue
        where = urlsplit(p.url)
        if not where.hostname or where.port is None:
            continue
        labels = {"deployment": plan.deployment, "role": p.role, "process": p.name, "node": p.node}
        out.append({"targets": [f"{where.hostname}:{where.port}"], "labels": labels})
    return out


def scrape_config(deployment: str, interval_s: float) -> dict[str, object]:
    return {
        "global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
        "rule_files": [f"ucmctl-{deployment}-alerts.yml"],
        "scrape_configs": [
            {
                "job_name": f"ucmctl-{deployment}",
                "metrics_path": "/metrics",
                "file_sd_configs": [{"files": [f"targets/{deployment}.json"], "refresh_interval": "30s"}],
            }
        ],
    }


def rules(deployment: str) -> dict[str, object]:
    """Alerts for the pitfalls: a target down, decode preempting (its KV cache is full), the
    external hit rate collapsing (the store stopped serving), store errors, proxy upstream errors."""
    d = f'deployment="{deployment}"'

    def ext_rate(offset: str = "") -> str:
        hits = names.EXTERNAL_PREFIX_CACHE_HITS + "_total"
        queries = names.EXTERNAL_PREFIX_CACHE_QUERIES + "_total"
        return (
            f"sum by (role) (rate({hits}{{{d}}}[10m]{offset})) / "
            f"sum by (role) (rate({queries}{{{d}}}[10m]{offset}))"
        )

    return {
        "groups": [
            {
                "name": f"ucmctl-{deployment}",
                "rules": [
                    {
                        "alert": "UcmctlTargetDown",
                        "expr": f"up{{{d}}} == 0",
                        "for": "1m",
                        "labels": {"severity": "critical"},
                        "annotations": {
                            "summary": "{{ $labels.process }} on {{ $labels.node }} answers no /metrics",
                            "fix": "`ucmctl status` shows it; `ucmctl logs` its last lines",
                        },
                    },
                    {
                        "alert": "UcmctlDecodePreempting",
                        "expr": f"sum by (process) (increase({names.PREEMPTIONS}_total"
                        f'{{{d},role="decode"}}[5m])) > 0',
                        "for": "1m",
                        "labels": {"severity": "warning"},
                        "annotations": {
                            "summary": "{{ $labels.process }} preempted requests: its KV cache is full",
                            "fix": "lower the concurrency or max-num-seqs, or add decode instances",
                        },
                    },
                    {
                        "alert": "UcmctlExternalHitRateCollapsed",
                        "expr": f"({ext_rate()}) < 0.5 * ({ext_rate(' offset 1h')})",
                        "for": "5m",
                        "labels": {"severity": "warning"},
                        "annotations": {
                            "summary": "the external (UCM store) hit rate of {{ $labels.role }} fell below "
                            "half of what it was an hour ago",
                            "fix": "check the store's errors and the storage mount (`ucmctl status`)",
                        },
                    },
                    {
                        "alert": "UcmctlStoreErrors",
                        # one per counter, joined by `or`: increase() of a name regex would drop the names and
                        # leave series alike (Prometheus refuses that vector)
                        "expr": " or ".join(
                            f"sum by (process) (increase({ucm_errors}_total{{{d}}}[5m])) > 0"
                            for op in ("load", "save", "lookup")
                            for ucm_errors in [names.ucm_counter(f"{op}_errors")]
                        ),
                        "labels": {"severity": "warning"},
                        "annotations": {
                            "summary": "the UCM store of {{ $labels.process }} failed blocks (recomputed)",
                            "fix": "check the storage backend's mount on that node",
                        },
                    },
                    {
                        "alert": "UcmctlProxyUpstreamErrors",
                        "expr": f"sum by (reason) (increase({names.PROXY_ERRORS}{{{d}}}[5m])) > 0",
                        "labels": {"severity": "warning"},
                        "annotations": {
                            "summary": "the proxy answered requests with errors ({{ $labels.reason }})",
                            "fix": "`ucmctl status`; the proxy's log names the instance",
                        },
                    },
                ],
            }
        ]
    }


def render(plan: Plan, interval_s: float = 5.0) -> dict[str, str]:
    """Relative path: text, every file of the folder."""
    found = targets(plan)
    if not found:
        raise UcmctlError.one(
            f"deployment '{plan.deployment}' has no /metrics endpoint to scrape",
            fix="a topology with API servers (prefill, decode or mixed) has them",
        )
    name = plan.deployment
    files = {
        "prometheus.yml": yaml.safe_dump(scrape_config(name, interval_s), sort_keys=False),
        f"ucmctl-{name}-alerts.yml": yaml.safe_dump(rules(name), sort_keys=False, width=1000),
        f"targets/{name}.json": json.dumps(found, indent=1) + "\n",
    }
    files.update({f"dashboards/{n}": text for n, text in dashboards(name).items()})
    return files


def write(files: dict[str, str], folder: Path) -> list[Path]:
    """Write `files` into `folder` (made when missing). Refused, nothing written, when the folder
    holds a file ucmctl did not write there (its manifest lists what it did)."""
    if folder.exists() and not folder.is_dir():
        raise UcmctlError.one("is a file, not a folder", file=str(folder), key="--prometheus")
    known = set((folder / MANIFEST).read_text().split()) if (folder / MANIFEST).is_file() else set()
    if folder.is_dir():
        mine = known | {MANIFEST}
        theirs = sorted(
            rel
            for rel in (str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
            if rel not in mine
        )
        if theirs:
            shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
            raise UcmctlError.one(
                f"the folder holds files ucmctl did not write ({shown})",
                file=str(folder),
                key="--prometheus",
                fix="name an empty or a new folder",
            )
    written = []
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    (folder / MANIFEST).write_text("\n".join(sorted(known | set(files))) + "\n")
    return written
