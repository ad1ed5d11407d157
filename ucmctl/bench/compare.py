"""`ucmctl bench compare`: the CI regression gate.

Each side is one or more saved results (files, or folders of them); repeats are the cells of
equal (scenario, input length) across them. For every limit such as `ttft_p50=5%`, the change
of the mean from baseline to new is judged: with at least two samples on each side the change
is a regression only when it exceeds the limit *and* the 95% confidence interval of the
difference (Welch) lies wholly on the worse side; with single samples, by the change alone.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from ucmctl.bench.report import cell_key, load_document
from ucmctl.core.errors import UcmctlError

DEFAULT_LIMITS = "ttft_mean=10%,tpot_mean=10%,e2el_mean=10%,output_throughput=10%"
HIGHER_IS_BETTER = {"output_throughput", "request_throughput", "total_token_throughput", "request_goodput"}
_STAT_ALIASES = {
    "p50": "median",
    "median": "median",
    "mean": "mean",
    "std": "std",
    "p90": "p90",
    "p99": "p99",
}
# Two-sided 95% Student t quantiles by degrees of freedom (1..30); 1.96 beyond.
_T95 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


@dataclass(frozen=True)
class Limit:
    name: str  # as the user wrote it: ttft_p50
    key: str  # the result key: median_ttft_ms
    fraction: float  # 0.05 for 5%
    higher_is_better: bool


@dataclass
class Verdict:
    cell: str
    limit: Limit
    base: list[float]
    new: list[float]
    change: float  # relative change of the means, signed so that > 0 is worse
    ci: tuple[float, float] | None  # 95% CI of the relative change (worse > 0), with repeats
    regression: bool


def t95(df: float) -> float:
    if df < 1:
        return _T95[0]
    return _T95[int(df) - 1] if df <= 30 else 1.96


def parse_limits(text: str) -> list[Limit]:
    limits = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        try:
            v = value.strip()
            fraction = float(v.removesuffix("%")) / (100 if v.endswith("%") else 1)
        except ValueError:
            fraction = -1.0
        if not sep or fraction < 0:
            raise UcmctlError.one(
                f"'{part}' is not NAME=PERCENT", key="--max-regression", fix="e.g. ttft_p50=5%,tpot_mean=3%"
            )
        if name in HIGHER_IS_BETTER:
            limits.append(Limit(name, name, fraction, True))
            continue
        metric, _, stat = name.rpartition("_")
        if metric not in ("ttft", "tpot", "itl", "e2el") or stat not in _STAT_ALIASES:
            raise UcmctlError.one(
                f"unknown metric '{name}'",
                key="--max-regression",
                fix="use ttft|tpot|itl|e2el with _mean|_median|_p50|_p90|_p99|_std, "
                "or output_throughput, request_throughput, total_token_throughput, request_goodput",
            )
        limits.append(Limit(name, f"{_STAT_ALIASES[stat]}_{metric}_ms", fraction, False))
    if not limits:
        raise UcmctlError.one("no limits given", key="--max-regression")
    return limits


def load_side(path: Path, allow_lost: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Measure phases by cell label ('scenario/input'), from a file or every *.json of a folder.
    A phase that lost a process of the deployment while it ran is refused unless `allow_lost`:
    its figures are not a sample of the deployment."""
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise UcmctlError.one("no *.json results in this folder", file=str(path))
    elif path.is_file():
        files = [path]
    else:
        raise UcmctlError.one("no such file or folder", file=str(path))
    cells: dict[str, list[dict[str, Any]]] = {}
    for f in files:
        for cell in load_document(f).get("cells", []):
            if not cell.get("measure"):
                continue
            label = f"{cell.get('scenario') or 'run'}/{cell_key(cell)}"
            lost = cell["measure"].get("lost") or []
            fault = cell["measure"].get("fault") or {}
            if (lost or fault.get("injected")) and not allow_lost:
                what = ", ".join(f"{x['process']} on {x['node']} ({x['how']})" for x in lost)
                what = f"lost {what}" if lost else f"had the fault {fault['spec']} injected"
                raise UcmctlError.one(
                    f"{label}: its measure phase {what}: its figures are not the deployment's",
                    file=str(f),
                    fix="rerun it, or pass --allow-lost to gate on it anyway",
                )
            cells.setdefault(label, []).append(cell["measure"])
    return cells


def _judge(cell: str, limit: Limit, base: list[float], new: list[float]) -> Verdict:
    mb, mn = statistics.fmean(base), statistics.fmean(new)
    sign = -1.0 if limit.higher_is_better else 1.0
    change = sign * (mn - mb) / mb if mb else (0.0 if mn == mb else math.inf)
    ci = None
    if len(base) >= 2 and len(new) >= 2 and mb:
        vb, vn = statistics.variance(base) / len(base), statistics.variance(new) / len(new)
        se = math.sqrt(vb + vn)
        df = (vb + vn) ** 2 / ((vb**2 / (len(base) - 1)) + (vn**2 / (len(new) - 1))) if se else 1e9
        half = t95(df) * se / abs(mb)
        ci = (change - half, change + half)
        regression = change > limit.fraction and ci[0] > 0
    else:
        regression = change > limit.fraction
    return Verdict(cell, limit, base, new, change, ci, regression)


def compare(
    base: dict[str, list[dict[str, Any]]],
    new: dict[str, list[dict[str, Any]]],
    limits: list[Limit],
    min_repeats: int = 1,
) -> list[Verdict]:
    common = [c for c in base if c in new]
    if not common:
        raise UcmctlError.one(
            f"no cell in common: baseline has {sorted(base)}, new has {sorted(new)}",
            fix="compare results of the same input lengths and scenarios",
        )
    verdicts = []
    for cell in common:
        for side, runs in (("baseline", base[cell]), ("new", new[cell])):
            if len(runs) < min_repeats:
                raise UcmctlError.one(
                    f"{side} has {len(runs)} sample(s) of {cell}, --repeats asks for {min_repeats}",
                    fix="pass a folder of repeated results",
                )
        for limit in limits:
            b = [float(m[limit.key]) for m in base[cell] if m.get(limit.key) is not None]
            n = [float(m[limit.key]) for m in new[cell] if m.get(limit.key) is not None]
            if not b and not n:
                continue  # neither side measured it here (goodput asked of other cells only)
            if not b or not n:
                raise UcmctlError.one(f"{cell} has no '{limit.key}' on one side")
            verdicts.append(_judge(cell, limit, b, n))
    for limit in limits:
        if not any(v.limit == limit for v in verdicts):
            hint = "request_goodput needs --goodput on both runs" if limit.key == "request_goodput" else None
            raise UcmctlError.one(
                f"no cell has '{limit.key}' on both sides", key="--max-regression", fix=hint
            )
    return verdicts


def _fmt(values: list[float]) -> str:
    m = statistics.fmean(values)
    if len(values) < 2:
        return f"{m:.2f}"
    half = t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{m:.2f} ± {half:.2f} (n={len(values)})"


def markdown(verdicts: list[Verdict]) -> str:
    bad = [v for v in verdicts if v.regression]
    verdict = "REGRESSION" if bad else "OK"
    title = f"**ucmctl bench compare: {verdict}** ({len(bad)} of {len(verdicts)} over limit)"
    lines = [
        title,
        "",
        "| cell | metric | baseline | new | change (worse > 0) | 95% CI | limit | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        ci = "-" if v.ci is None else f"[{100 * v.ci[0]:+.1f}%, {100 * v.ci[1]:+.1f}%]"
        lines.append(
            f"| {v.cell} | {v.limit.name} | {_fmt(v.base)} | {_fmt(v.new)} | {100 * v.change:+.1f}% "
            f"| {ci} | {100 * v.limit.fraction:.1f}% | {'**regression**' if v.regression else 'ok'} |"
        )
    return "\n".join(lines) + "\n"


def junit(verdicts: list[Verdict], path: Path) -> None:
    suite = ET.Element(
        "testsuite",
        name="ucmctl-bench-compare",
        tests=str(len(verdicts)),
        failures=str(sum(v.regression for v in verdicts)),
        errors="0",
    )
    for v in verdicts:
        case = ET.SubElement(suite, "testcase", classname=f"bench.{v.cell}", name=v.limit.name)
        if v.regression:
            failure = ET.SubElement(
                case,
                "failure",
                message=f"{v.limit.name} worse by {100 * v.change:.1f}% "
                f"(limit {100 * v.limit.fraction:.1f}%)",
            )
            failure.text = f"baseline {_fmt(v.base)}, new {_fmt(v.new)}"
    path.parent.mkdir(parents=True, exist_ok=True)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
