"""Results out: the terminal table, the versioned JSON document (its provenance:
`bench/provenance.py`), CSV, Markdown and a PNG plot. Cells are dicts: {"scenario"?,
"input_len", "repeat", "prefix_ratio", "preseed": phase | None, "measure": phase}; a phase
carries `vllm bench serve`'s key names."""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console

from ucmctl.bench.cells import first_leg_hit_rate, label_of, row_name, workload_of
from ucmctl.bench.fault import fault_lines
from ucmctl.bench.metrics import METRICS, STATS
from ucmctl.bench.results import READABLE_VERSIONS, SCHEMA_VERSION
from ucmctl.bench.workloads import BY_KIND, PrefixSpec
from ucmctl.core.errors import UcmctlError
from ucmctl.core.store_errors import describe
from ucmctl.core.tables import FIGURE, NAME, PAIR, fitted

KIND = "ucmctl-bench-result"
VLLM_KEYS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    *(f"{s}_{m}_ms" for m in METRICS for s in STATS),
)
OPTIONAL_KEYS = ("request_goodput", "good_completed")  # present when --goodput was given


def phase_name(cell: dict[str, Any], phase: str) -> str:
    """The phase as the cell's workload names it (a workload this version lacks: as prefix does)."""
    return BY_KIND.get(workload_of(cell), PrefixSpec).phases[phase]


def ideal_of(cell: dict[str, Any]) -> float | None:
    """The hit rate the workload allows: its reusable fraction, else the prefix ratio asked."""
    ideal = cell.get("ideal_hit_rate")
    return ideal if ideal is not None else cell.get("prefix_ratio")


def preemptions_of(phase: dict[str, Any] | None) -> int | None:
    total = ((phase or {}).get("hit_rate") or {}).get("total") or {}
    value = total.get("preemptions")
    return None if value is None else int(value)


def storage_errors_of(phase: dict[str, Any] | None) -> str | None:
    """What the UCM store failed to load or save in a phase, by kind, in words; None if nothing."""
    total = ((phase or {}).get("hit_rate") or {}).get("total") or {}
    # ucm_load_errors_enotconn -> load_enotconn, ucm_load_waits_over_bound -> load_waits_over_bound
    counts = {k[4:].replace("_errors", "", 1): v for k, v in total.items() if k.startswith("ucm_")}
    return describe(counts, words=True) or None


# ---- the JSON document ----------------------------------------------------------------------
def document(
    cells: list[dict[str, Any]],
    config: dict[str, Any],
    prov: dict[str, Any],
    target: dict[str, Any] | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "provenance": prov,
        "config": config,
        "target": target or {},
        "cells": cells,
    }
    if len(cells) == 1:  # one measurement: also at the top, where `vllm bench serve` puts its keys
        measure = cells[0]["measure"]
        doc.update({k: measure[k] for k in VLLM_KEYS if k in measure})
        doc.update(
            {
                "num_prompts": config.get("num_prompts"),
                "max_concurrency": config.get("concurrency"),
                "request_rate": config.get("request_rate"),
            }
        )
    return doc


def save_json(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(finite(doc), indent=1, default=str, allow_nan=False) + "\n")
    os.replace(tmp, path)


def finite(value: Any) -> Any:
    """NaN and infinities become null (strict JSON); the rest is unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def load_document(path: Path) -> dict[str, Any]:
    """A saved result; UcmctlError (exit 2) when it is not one this version reads."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UcmctlError.one(f"cannot read a result: {exc}", file=str(path)) from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise UcmctlError.one("not a `ucmctl bench --save` result", file=str(path))
    if doc.get("schema_version") not in READABLE_VERSIONS:
        raise UcmctlError.one(
            f"schema_version {doc.get('schema_version')} is not {SCHEMA_VERSION}",
            file=str(path),
            fix="re-run the benchmark with this ucmctl",
        )
    return doc


# ---- flat rows: CSV, Markdown, plot ---------------------------------------------------------
def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _rate(phase: dict[str, Any] | None, key: str) -> float | None:
    total = ((phase or {}).get("hit_rate") or {}).get("total") or {}
    return total.get(key)


def rows(cells: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per (scenario, input length, repeat, phase)."""
    out = []
    for cell in cells:
        for phase in ("preseed", "measure"):
            p = cell.get(phase)
            if not p:
                continue
            point = cell.get("point") or {}
            row: dict[str, Any] = {
                "scenario": cell.get("scenario") or "",
                "workload": workload_of(cell),
                "label": row_name(cell),
                "point": cell.get("point_name"),
                "input_len": cell["input_len"],
                "repeat": cell.get("repeat", 0),
                "phase": phase,
                "request_rate_asked": point.get("request_rate"),
                "max_concurrency": point.get("max_concurrency"),
                "prompt_len": p.get("input_len"),
                "output_len": p.get("output_len"),
                "prefix_ratio": cell.get("prefix_ratio"),
            }
            row.update({k: p.get(k) for k in VLLM_KEYS})
            row.update({k: p.get(k) for k in OPTIONAL_KEYS})
            for key in ("local_hit_rate", "external_hit_rate", "hit_rate"):
                row[f"measured_{key}"] = _rate(p, key)
            row["measured_first_leg_hit_rate"] = first_leg_hit_rate(p)
            row["ideal_hit_rate"] = cell.get("ideal_hit_rate") if phase == "measure" else None
            row["preemptions"] = preemptions_of(p)
            row["aggregate"] = bool(cell.get("aggregate"))
            handed = p.get("kv_handover") or {}
            for key in ("mean_ms", "p50_ms", "p99_ms"):
                row[f"kv_handover_{key}"] = handed.get(key)
            out.append(row)
    return pd.DataFrame(out)


def save_csv(cells: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows(cells).to_csv(path, index=False, float_format="%.4f")


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.2f}"


def markdown(cells: list[dict[str, Any]]) -> str:
    """Measure phases as a Markdown table; a suite adds one TTFT/TPOT/E2EL group per scenario."""
    measured = [c for c in cells if c.get("measure")]
    scenarios = list(dict.fromkeys(c.get("scenario") or "" for c in measured))
    if scenarios != [""]:
        return suite_markdown(measured, scenarios)
    prefix_only = all(workload_of(c) == "prefix" for c in measured)
    head = (
        f"| {'input' if prefix_only else 'cell'} | output | ok/failed | TTFT mean / p99 (ms) "
        "| TPOT mean / p99 (ms) | ITL mean (ms) | E2EL mean / p99 (ms) | out tok/s "
        + (
            "| hit rate local / external (requested) |"
            if prefix_only
            else "| hit rate local / external / first leg (ideal) |"
        )
    )
    lines = [head, "|" + "---|" * 9]
    for c in measured:
        m = c["measure"]
        lines.append(
            f"| {row_name(c)} | {m['output_len']} | {m['completed']}/{m['failed']} "
            f"| {_ms(m['mean_ttft_ms'])} / {_ms(m['p99_ttft_ms'])} | {_ms(m['mean_tpot_ms'])} / "
            f"{_ms(m['p99_tpot_ms'])} | {_ms(m['mean_itl_ms'])} | {_ms(m['mean_e2el_ms'])} / "
            f"{_ms(m['p99_e2el_ms'])} | {m['output_throughput']:.1f} | {_pct(_rate(m, 'local_hit_rate'))} / "
            f"{_pct(_rate(m, 'external_hit_rate'))}"
            + ("" if prefix_only else f" / {_pct(first_leg_hit_rate(m))}")
            + f" ({_pct(ideal_of(c))}) |"
        )
    return "\n".join(lines) + "\n"


def _mean_of(cells: list[dict[str, Any]], key: str) -> float | None:
    values = [c["measure"][key] for c in cells if c["measure"].get(key) is not None]
    return sum(values) / len(values) if values else None


def suite_markdown(cells: list[dict[str, Any]], scenarios: list[str]) -> str:
    """The guides' side-by-side table: input, output, then TTFT / TPOT / E2EL per scenario
    (means over repeats), and the measured hit rate per scenario."""
    prefix_only = all(workload_of(c) == "prefix" for c in cells)
    first = "input" if prefix_only else "cell"
    head = f"| {first} | output | " + " | ".join(f"{s} TTFT / TPOT / E2EL (ms)" for s in scenarios)
    head += " | " + " | ".join(f"{s} hit rate" for s in scenarios)
    head += " |" if prefix_only else " | ideal |"
    lines = [head, "|" + "---|" * (2 + 2 * len(scenarios) + (0 if prefix_only else 1))]
    for label in dict.fromkeys(row_name(c) for c in cells):
        group = [c for c in cells if row_name(c) == label]
        out_len = group[0]["measure"]["output_len"]
        lat, hits = [], []
        for s in scenarios:
            mine = [c for c in group if (c.get("scenario") or "") == s]
            if not mine:
                lat.append("-")
                hits.append("-")
                continue
            lat.append(" / ".join(_ms(_mean_of(mine, f"mean_{m}_ms")) for m in ("ttft", "tpot", "e2el")))
            whole = (
                _rate(mine[0]["measure"], "hit_rate")
                if prefix_only
                else first_leg_hit_rate(mine[0]["measure"])
            )
            hits.append(_pct(whole))
        ideal = "" if prefix_only else f" {_pct(ideal_of(group[0]))} |"
        lines.append(f"| {label} | {out_len} | " + " | ".join(lat) + " | " + " | ".join(hits) + " |" + ideal)
    return "\n".join(lines) + "\n"


def check_plot_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UcmctlError.one(
            "--plot needs matplotlib, which is not installed",
            key="--plot",
            fix="pip install matplotlib, or drop --plot",
        ) from None


def save_plot(cells: list[dict[str, Any]], path: Path) -> None:
    """PNG: TTFT and E2EL (means) by input length, one line per scenario."""
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = rows(cells)
    frame = frame[frame["phase"] == "measure"]
    one_point = all(frame[k].nunique(dropna=False) <= 1 for k in ("request_rate_asked", "max_concurrency"))
    by_length = bool((frame["workload"] == "prefix").all()) and one_point
    cells_only = frame[~frame["aggregate"]]
    xs = cells_only["input_len"] if by_length else cells_only["label"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "mean_ttft_ms", "TTFT"), (axes[1], "mean_e2el_ms", "E2EL")):
        groups = list(frame.groupby("scenario", sort=False))
        if xs.nunique() <= 1:  # one point a scenario: bars (a line through one point draws nothing)
            names = [str(scenario or "run") for scenario, _ in groups]
            values = [group[~group["aggregate"]][key].mean() for _, group in groups]
            bars = ax.bar(range(len(names)), values, color=[f"C{i}" for i in range(len(names))])
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
            ax.set_xticks(range(len(names)), names)
            only = xs.iloc[0] if len(xs) else ""
            ax.set_xlabel(f"scenario ({'input ' + str(only) + ' tokens' if by_length else only})")
        else:
            for scenario, group in groups:
                plain, summed = group[~group["aggregate"]], group[group["aggregate"]]
                if by_length:
                    series = plain.groupby("input_len")[key].mean()
                    (line,) = ax.plot(series.index, series.values, marker="o", label=scenario or "run")
                else:  # rounds, a trace, documents: one point per cell, in run order
                    series = plain.groupby("label", sort=False)[key].mean()
                    (line,) = ax.plot(range(len(series)), series.values, marker="o", label=scenario or "run")
                    ax.set_xticks(range(len(series)), [str(x) for x in series.index], rotation=20)
                for _, row in summed.iterrows():  # `rounds 2-R`: all of them at once, not a round
                    ax.axhline(row[key], linestyle="--", color=line.get_color(), alpha=0.7,
                               label=f"{scenario or 'run'} {row['label']}")  # fmt: skip
            ax.set_xlabel("input length (tokens)" if by_length else "cell")
        ax.set_ylabel(f"mean {title} (ms)")
        ax.set_title(f"{title} by {'input length' if by_length else 'cell'}")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- the terminal ----------------------------------------------------------------------------
def print_cells(cells: list[dict[str, Any]], console: Console) -> None:
    """Two tables (latencies; throughput and hit rates), then every failure and unread /metrics.
    A figure nothing measured (every request of the phase failed) shows as `-`."""
    has_scenario = any(c.get("scenario") for c in cells)
    has_point = any(c.get("point_name") for c in cells)
    prefix_only = all(workload_of(c) == "prefix" for c in cells)
    lead = [("scenario", NAME)] if has_scenario else []
    lead += [("point", NAME)] if has_point else []
    latency, load = _table_rows(cells, has_scenario, has_point, prefix_only)
    head = [*lead, ("input" if prefix_only else "cell", NAME), ("phase", NAME)]
    metric_cols = [(m.upper(), PAIR) for m in METRICS]
    for t in fitted(console, "latency, ms (mean / p99)", head, metric_cols, latency):
        console.print(t)
        console.print()
    ideal = "asked" if prefix_only else "ideal"
    hits = ("hit L", "hit E") if prefix_only else ("hit L", "hit E", "hit")
    load_cols = [(c, FIGURE) for c in ("ok", "failed", "req/s", "tok/s", *hits, ideal)]
    title = "throughput and hit rate (measured local, external" + ("; asked)" if prefix_only else
             ", first leg's whole; ideal)")  # fmt: skip
    for t in fitted(console, title, head, load_cols, load):
        console.print(t)
        console.print()
    say = functools.partial(console.print, soft_wrap=False)  # messages wrap at the width
    for cell in cells:
        for phase in ("preseed", "measure"):
            _print_phase_notes(cell, phase, say)


def _table_rows(
    cells: list[dict[str, Any]], has_scenario: bool, has_point: bool, prefix_only: bool
) -> tuple[list[list[str]], list[list[str]]]:
    """The rows of the two tables: (latencies, throughput and hit rates), a row per phase."""
    latency, load = [], []
    for cell in cells:
        for phase in ("preseed", "measure"):
            p = cell.get(phase)
            if not p:
                continue
            first = [cell.get("scenario") or ""] if has_scenario else []
            first += [cell.get("point_name") or ""] if has_point else []
            first += [
                label_of(cell) + (f" #{cell['repeat'] + 1}" if cell.get("repeat") else ""),
                phase_name(cell, phase),
            ]
            failed = f"[red]{p['failed']}[/]" if p["failed"] else "0"
            latency.append(
                [*first, *(f"{_ms(p.get(f'mean_{m}_ms'))} / {_ms(p.get(f'p99_{m}_ms'))}" for m in METRICS)]
            )
            requested = _pct(ideal_of(cell)) if phase == "measure" else "-"
            measured = p["completed"] > 0
            load.append(
                [
                    *first,
                    str(p["completed"]),
                    failed,
                    f"{p['request_throughput']:.2f}" if measured else "-",
                    f"{p['output_throughput']:.1f}" if measured else "-",
                    _pct(_rate(p, "local_hit_rate")),
                    _pct(_rate(p, "external_hit_rate")),
                    *([] if prefix_only else [_pct(first_leg_hit_rate(p))]),
                    requested,
                ]
            )
    return latency, load


def _print_phase_notes(cell: dict[str, Any], phase: str, say: Callable[..., None]) -> None:
    """The lines under the tables for one phase: failures, preemptions, processes lost, the KV
    handover, the fault, store errors, goodput, trace lag, hit rates by role, and warnings."""
    p = cell.get(phase) or {}
    name = f"{phase_name(cell, phase)} {row_name(cell)}"
    for e in [] if cell.get("aggregate") else p.get("errors", []):  # said per round
        say(f"{name}: {e['count']} x {e['error']}", style="red", markup=False)
    preempted = preemptions_of(p)
    if preempted:
        say(
            f"{name}: {preempted} preemption(s): the KV cache was full (figures include them)",
            style="yellow",
            markup=False,
        )
    for lost in p.get("lost") or []:
        say(
            f"{name}: lost {lost['process']} on {lost['node']} ({lost['how']}, "
            f"{lost['into_s']:.0f} s in): figures include the time without it",
            style="red",
            markup=False,
        )
    handed = p.get("kv_handover") or {}
    if handed.get("count") and phase == "measure":
        say(
            f"{name}: KV handover (proxy, {handed['count']} streamed): mean "
            f"{_ms(handed['mean_ms'])}, p50 {_ms(handed['p50_ms'])}, p99 {_ms(handed['p99_ms'])} "
            f"ms; TTFT mean {_ms(p.get('mean_ttft_ms'))} ms",
            markup=False,
        )
    if p.get("fault"):
        for line in fault_lines(name, p["fault"]):
            say(line, markup=False)
    storage = storage_errors_of(p)
    if storage:
        say(
            f"{name}: UCM store: {storage} (misses are recomputed)",
            style="yellow",
            markup=False,
        )
    if p.get("request_goodput") is not None:
        slos = ", ".join(f"{k} <= {v:g} ms" for k, v in (p.get("goodput_slos_ms") or {}).items())
        say(
            f"{name}: goodput {p['request_goodput']:.2f} req/s ({p.get('good_completed')} of "
            f"{p['completed'] + p['failed']} requests met {slos})",
            markup=False,
        )
    lag = p.get("send_lag_ms")
    if lag and lag.get("p99") is not None:
        say(
            f"{name}: sends behind the trace's schedule by {lag['p50']:.2f} ms p50, "
            f"{lag['p99']:.2f} ms p99, {lag['max']:.2f} ms max",
            markup=False,
        )
    by_role = (p.get("hit_rate") or {}).get("by_role") or {}
    # In PD the decode leg finds what the prefill leg just stored: judge the first leg.
    rate = first_leg_hit_rate(p)
    if len(by_role) > 1:
        parts = []
        for role, r in by_role.items():
            local, ext = r.get("local_hit_rate"), r.get("external_hit_rate")
            parts.append(f"{role} local {_pct(local)}, external {_pct(ext)}")
        say(f"{cell.get('scenario') or 'run'} {name} hit rates: "
                      + "; ".join(parts), markup=False)  # fmt: skip
    if phase == "preseed" and workload_of(cell) == "prefix" and rate is not None and rate > 0.05:
        say(
            f"[yellow]preseed {row_name(cell)}: {100 * rate:.1f}% of its prompt tokens were "
            "already cached (a run with the same --seed and --cache-salt before, or a server "
            "that ignores cache_salt?): the measured hit rate includes them; leave out "
            "--cache-salt, use another --seed, or reset the caches[/]"
        )
    restarted = (p.get("hit_rate") or {}).get("restarted")
    if restarted:
        say(f"[yellow]{name}: {', '.join(restarted)} started again within the phase: its hits "
            "before that were lost with the old process and are not counted[/]")  # fmt: skip
    missing = (p.get("hit_rate") or {}).get("missing")
    if missing:
        say(f"[yellow]no /metrics from {', '.join(missing)}: hit rate without them[/]")
