"""`ucmctl bench compare`: the CI regression gate.

Each side is one or more saved results (files, or folders of them), or the baseline is the
last N runs of the results history with the new result's provenance key; repeats are the cells
of equal (scenario, input length) across them. For every limit such as `ttft_p50=5%`, the
change of the mean from baseline to new is judged:

- at least two samples on each side: a regression only when the change exceeds the limit *and*
  the 95% confidence interval of the difference (Welch) lies wholly on the worse side;
- one new sample against at least two baseline samples (tonight's run against the history): a
  regression only when the change exceeds the limit *and* the new value lies outside the
  baseline's 95% prediction interval for one more sample (mean +- t * sd * sqrt(1 + 1/n));
- a single sample on the baseline side: by the change alone.

The intervals are corrected for the number of judgements made at once (Bonferroni: with m
(cell, metric) pairs each interval is at 1 - 0.05 / m), so that over a whole comparison an A/A
run crosses an interval at most 5% of the time; the limit must be crossed as well.

Both sides must be of one setup: their results' provenance may differ in one named parameter
at most (`--vary`); any other difference is refused and named (`differences`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from ucmctl.bench.report import load_document
from ucmctl.bench.results import Phase
from ucmctl.bench.results import cells_of as typed_cells
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
    ci: tuple[float, float] | None  # 95% interval of the relative change (worse > 0): CI, or prediction
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


Docs = list[tuple[str, dict[str, Any]]]  # (where it came from, the saved result)


def load_docs(path: Path) -> Docs:
    """The saved results of a file, or of every *.json of a folder."""
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise UcmctlError.one("no *.json results in this folder", file=str(path))
    elif path.is_file():
        files = [path]
    else:
        raise UcmctlError.one("no such file or folder", file=str(path))
    return [(str(f), load_document(f)) for f in files]


def load_side(path: Path, allow_lost: bool = False) -> dict[str, list[Phase]]:
    return cells_of(load_docs(path), allow_lost)


def cells_of(docs: Docs, allow_lost: bool = False) -> dict[str, list[Phase]]:
    """Measure phases by cell label ('scenario/input'), read as typed. A phase that lost a
    process of the deployment while it ran is refused unless `allow_lost`: its figures are not
    a sample of the deployment."""
    cells: dict[str, list[Phase]] = {}
    for where, doc in docs:
        for cell in typed_cells(doc.get("cells", [])):
            measure = cell.measure
            if measure is None or not measure.given():
                continue
            label = f"{cell.scenario or 'run'}/{cell.key()}"
            lost = measure.lost or []
            fault = measure.fault or {}
            if (lost or fault.get("injected")) and not allow_lost:
                what = ", ".join(f"{x.process} on {x.node} ({x.how})" for x in lost)
                what = f"lost {what}" if lost else f"had the fault {fault['spec']} injected"
                raise UcmctlError.one(
                    f"{label}: its measure phase {what}: its figures are not the deployment's",
                    file=where,
                    fix="rerun it, or pass --allow-lost to gate on it anyway",
                )
            cells.setdefault(label, []).append(measure)
    return cells


# ---- provenance: what may differ between the sides ---------------------------------------------
_PARAMETERS = {
    "topology_digest": "topology",
    "plan_digest": "topology",
    "device_model": "device",
    "cpu_model": "device",
    "images": "image",
}


def parameter_of(field: str) -> str:
    """The parameter a key field belongs to: `engine@n1` -> engine, `config.input_lens` ->
    input_lens, `plan_digest` -> topology (a topology's edit changes both digests)."""
    name = field.split("@", 1)[0].removeprefix("config.")
    if name.startswith("image "):
        return "image"
    return _PARAMETERS.get(name, name)


def differences(docs: Docs) -> dict[str, list[str]]:
    """Each parameter whose key fields are not equal in every one of `docs`, with what differs
    (`engine@n1: 0.11.0 | 0.11.1`). A field a result does not have (a result of an older ucmctl)
    is not known, so not a difference."""
    from ucmctl.bench.history import key_fields

    seen: dict[str, list[str]] = {}
    for _, doc in docs:
        for field, value in key_fields(doc).items():
            if value is None:
                continue
            text = json.dumps(value, sort_keys=True, default=str)
            if text not in seen.setdefault(field, []):
                seen[field].append(text)
    out: dict[str, list[str]] = {}
    for field, values in seen.items():
        if len(values) > 1:
            shown = " | ".join(v if len(v) <= 40 else v[:37] + "..." for v in values)
            out.setdefault(parameter_of(field), []).append(f"{field}: {shown}")
    return out


def check_provenance(base: Docs, new: Docs, vary: str | None) -> dict[str, list[str]]:
    """Refuse (exit 2) runs that differ in more than the one parameter `vary`; what differs."""
    found = differences(base + new)
    beyond = {p: d for p, d in found.items() if p != vary}
    if beyond:
        named = "; ".join(f"{p} ({', '.join(d)})" for p, d in beyond.items())
        more = f"more than {vary}" if vary else "their setup"
        raise UcmctlError.one(
            f"the runs differ in {more}: {named}",
            fix="compare runs of one setup, or name the one parameter that differs with --vary "
            f"(e.g. --vary {next(iter(beyond))})",
        )
    return found


def _digest(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def history_baseline(
    path: Path, new: Docs, last: int, allow_lost: bool, label: str | None = None
) -> tuple[Docs, list[int], str]:
    """The last `last` runs of the history with the provenance key of `new` (and `label`, when
    given), the new results themselves left out should they be in it too: (their results,
    their run numbers, the key)."""
    from ucmctl.bench import history

    keys = {history.provenance_key(history.key_fields(doc)) for _, doc in new}
    if len(keys) > 1:
        check_provenance([], new, None)  # names what differs among them
    (key,) = keys
    mine = {_digest(doc) for _, doc in new}
    docs: Docs = []
    ids: list[int] = []
    for run in reversed(history.runs(path, history.Filter(key=key, label=label, last=last + len(new) + 50))):
        if len(docs) == last:
            break
        doc = history.document(path, run.id)
        if _digest(doc) in mine:
            continue  # the new result itself, recorded when it ran
        if run.lost and not allow_lost:
            continue  # not a sample of the deployment
        docs.append((f"{path} run #{run.id}", doc))
        ids.append(run.id)
    if not docs:
        labelled = f" labelled {label}" if label else ""
        raise UcmctlError.one(
            f"no earlier run of this setup (provenance key {key[:8]}){labelled} in the results history",
            file=str(path),
            fix="run the benchmark on this setup first (each run is recorded), or pass a BASELINE result",
        )
    return list(reversed(docs)), sorted(ids), key


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (p > 0.5), without SciPy: the CDF as an integral over the angle
    phi = atan(x / sqrt(df)), where the density becomes cos(phi)^(df - 1), smooth for every df
    (Simpson's rule), inverted by bisection; exact to 1e-4, far below what a gate turns on."""
    if df > 1e6:
        return statistics.NormalDist().inv_cdf(p)
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)

    def cdf(x: float, n: int = 200) -> float:
        theta = math.atan(x / math.sqrt(df))
        h = theta / n
        f = [math.cos(i * h) ** (df - 1) for i in range(n + 1)]
        total = f[0] + f[-1] + sum((4 if i % 2 else 2) * f[i] for i in range(1, n))
        return 0.5 + scale * total * h / 3

    lo, hi = 0.0, 1.0
    while cdf(hi) < p and hi < 1e9:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def critical_t(df: float, judgements: int) -> float:
    """The two-sided 95% t quantile, Bonferroni-corrected for `judgements` made at once: over
    every (cell, metric) of one comparison, an A/A run is flagged at most 5% of the time."""
    if judgements <= 1:
        return t95(df)
    return t_quantile(1 - 0.05 / (2 * judgements), max(df, 1.0))


def _judge(cell: str, limit: Limit, base: list[float], new: list[float], judgements: int = 1) -> Verdict:
    mb, mn = statistics.fmean(base), statistics.fmean(new)
    sign = -1.0 if limit.higher_is_better else 1.0
    change = sign * (mn - mb) / mb if mb else (0.0 if mn == mb else math.inf)
    ci = None
    if len(base) >= 2 and len(new) >= 2 and mb:
        vb, vn = statistics.variance(base) / len(base), statistics.variance(new) / len(new)
        se = math.sqrt(vb + vn)
        df = (vb + vn) ** 2 / ((vb**2 / (len(base) - 1)) + (vn**2 / (len(new) - 1))) if se else 1e9
        half = critical_t(df, judgements) * se / abs(mb)
        ci = (change - half, change + half)
        regression = change > limit.fraction and ci[0] > 0
    elif len(base) >= 2 and mb:  # one new sample: the baseline's 95% prediction interval
        t = critical_t(len(base) - 1, judgements)
        half = t * statistics.stdev(base) * math.sqrt(1 + 1 / len(base)) / abs(mb)
        ci = (change - half, change + half)
        regression = change > limit.fraction and ci[0] > 0
    else:
        regression = change > limit.fraction
    return Verdict(cell, limit, base, new, change, ci, regression)


def compare(
    base: dict[str, list[Phase]],
    new: dict[str, list[Phase]],
    limits: list[Limit],
    min_repeats: int = 1,
) -> list[Verdict]:
    common = [c for c in base if c in new]
    if not common:
        raise UcmctlError.one(
            f"no cell in common: baseline has {sorted(base)}, new has {sorted(new)}",
            fix="compare results of the same input lengths and scenarios",
        )
    judged: list[tuple[str, Limit, list[float], list[float]]] = []
    for cell in common:
        for side, runs in (("baseline", base[cell]), ("new", new[cell])):
            if len(runs) < min_repeats:
                raise UcmctlError.one(
                    f"{side} has {len(runs)} sample(s) of {cell}, --repeats asks for {min_repeats}",
                    fix="pass a folder of repeated results",
                )
        for limit in limits:
            b = [float(m.value(limit.key)) for m in base[cell] if m.value(limit.key) is not None]
            n = [float(m.value(limit.key)) for m in new[cell] if m.value(limit.key) is not None]
            if not b and not n:
                continue  # neither side measured it here (goodput asked of other cells only)
            if not b or not n:
                raise UcmctlError.one(f"{cell} has no '{limit.key}' on one side")
            judged.append((cell, limit, b, n))
    verdicts = [_judge(*j, judgements=len(judged)) for j in judged]
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


def markdown(verdicts: list[Verdict], head: str | None = None) -> str:
    """The summary: a title, what the baseline was (`head`), one table row per judgement."""
    bad = [v for v in verdicts if v.regression]
    verdict = "REGRESSION" if bad else "OK"
    title = f"**ucmctl bench compare: {verdict}** ({len(bad)} of {len(verdicts)} over limit)"
    lines = [
        title,
        "",
        *([head, ""] if head else []),
        "| cell | metric | baseline | new | change (worse > 0) | 95% interval | limit | verdict |",
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
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
