"""Results out: the terminal table, the versioned JSON document (its provenance:
`bench/provenance.py`), CSV, Markdown and a PNG plot. Each reads the cells as typed
(`results.Cell`, a runner's or a saved result's dicts read once); a phase carries
`vllm bench serve`'s key names."""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console

from ucmctl.bench import extras
from ucmctl.bench.extras import PhaseView
from ucmctl.bench.extras.preemptions import preemptions
from ucmctl.bench.extras.store_errors import store_errors
from ucmctl.bench.formats import ms as _ms
from ucmctl.bench.formats import pct as _pct
from ucmctl.bench.metrics import METRICS, STATS
from ucmctl.bench.open_model import plain
from ucmctl.bench.results import READABLE_VERSIONS, SCHEMA_VERSION, Cell, Phase, cells_of
from ucmctl.bench.workloads import BY_KIND, PrefixSpec
from ucmctl.core.errors import UcmctlError
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


Cells = Sequence[Cell | dict[str, Any]]  # typed, or a runner's dicts (read as typed)


def phase_name(cell: Cell, phase: str) -> str:
    """The phase as the cell's workload names it (a workload this version lacks: as prefix does)."""
    return BY_KIND.get(cell.workload_name(), PrefixSpec).phases[phase]


def preemptions_of(phase: dict[str, Any] | None) -> int | None:
    return preemptions(((phase or {}).get("hit_rate") or {}).get("total"))


def storage_errors_of(phase: dict[str, Any] | None) -> str | None:
    """What the UCM store failed to load or save in a phase, by kind, in words; None if nothing."""
    return store_errors(((phase or {}).get("hit_rate") or {}).get("total"))


# ---- the JSON document ----------------------------------------------------------------------
def document(
    cells: Cells,
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
        "cells": [plain(c) for c in cells],
    }
    if len(cells) == 1:  # one measurement: also at the top, where `vllm bench serve` puts its keys
        measure = doc["cells"][0]["measure"]
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
    """A saved result (its JSON object); UcmctlError (exit 2) when it is not one this version reads."""
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
def _rate(phase: Phase, key: str) -> float | None:
    return phase.totals().get(key)


def rows(cells: Cells) -> pd.DataFrame:
    """One row per (scenario, input length, repeat, phase)."""
    return pd.DataFrame([_row(cell, key, p) for cell in cells_of(cells) for key, p in cell.phases()])


def _row(cell: Cell, phase: str, p: Phase) -> dict[str, Any]:
    point = cell.point or {}
    row: dict[str, Any] = {
        "scenario": cell.scenario or "",
        "workload": cell.workload_name(),
        "label": cell.row_name(),
        "point": cell.point_name,
        "input_len": cell.input_len,
        "repeat": cell.repeat,
        "phase": phase,
        "request_rate_asked": point.get("request_rate"),
        "max_concurrency": point.get("max_concurrency"),
        "prompt_len": p.input_len,
        "output_len": p.output_len,
        "prefix_ratio": cell.prefix_ratio,
    }
    row.update({k: p.value(k) for k in VLLM_KEYS})
    row.update({k: p.value(k) for k in OPTIONAL_KEYS})
    for key in ("local_hit_rate", "external_hit_rate", "hit_rate"):
        row[f"measured_{key}"] = _rate(p, key)
    row["measured_first_leg_hit_rate"] = p.first_leg()
    row["ideal_hit_rate"] = cell.ideal_hit_rate if phase == "measure" else None
    row["preemptions"] = preemptions(p.totals())
    row["aggregate"] = cell.aggregate
    for key in ("mean_ms", "p50_ms", "p99_ms"):
        row[f"kv_handover_{key}"] = p.kv_handover.value(key) if p.kv_handover else None
    return row


def save_csv(cells: Cells, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows(cells).to_csv(path, index=False, float_format="%.4f")


def _measured(cells: Cells) -> list[tuple[Cell, Phase]]:
    """The cells whose measure phase ran, each with it."""
    return [(c, p) for c in cells_of(cells) for key, p in c.phases() if key == "measure"]


def markdown(cells: Cells) -> str:
    """Measure phases as a Markdown table; a suite adds one TTFT/TPOT/E2EL group per scenario."""
    measured = _measured(cells)
    scenarios = list(dict.fromkeys(c.scenario or "" for c, _ in measured))
    if scenarios != [""]:
        return suite_markdown([c for c, _ in measured], scenarios)
    prefix_only = all(c.workload_name() == "prefix" for c, _ in measured)
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
    for c, m in measured:
        lines.append(
            f"| {c.row_name()} | {m.output_len} | {m.completed}/{m.failed} "
            f"| {_ms(m.mean_ttft_ms)} / {_ms(m.p99_ttft_ms)} | {_ms(m.mean_tpot_ms)} / "
            f"{_ms(m.p99_tpot_ms)} | {_ms(m.mean_itl_ms)} | {_ms(m.mean_e2el_ms)} / "
            f"{_ms(m.p99_e2el_ms)} | {m.output_throughput:.1f} | {_pct(_rate(m, 'local_hit_rate'))} / "
            f"{_pct(_rate(m, 'external_hit_rate'))}"
            + ("" if prefix_only else f" / {_pct(m.first_leg())}")
            + f" ({_pct(c.ideal())}) |"
        )
    return "\n".join(lines) + "\n"


def _mean_of(cells: list[Cell], key: str) -> float | None:
    values = [c.measure.value(key) for c in cells if c.measure and c.measure.value(key) is not None]
    return sum(values) / len(values) if values else None


def suite_markdown(cells: list[Cell], scenarios: list[str]) -> str:
    """The guides' side-by-side table: input, output, then TTFT / TPOT / E2EL per scenario
    (means over repeats), and the measured hit rate per scenario (cells whose measure ran)."""
    prefix_only = all(c.workload_name() == "prefix" for c in cells)
    first = "input" if prefix_only else "cell"
    head = f"| {first} | output | " + " | ".join(f"{s} TTFT / TPOT / E2EL (ms)" for s in scenarios)
    head += " | " + " | ".join(f"{s} hit rate" for s in scenarios)
    head += " |" if prefix_only else " | ideal |"
    lines = [head, "|" + "---|" * (2 + 2 * len(scenarios) + (0 if prefix_only else 1))]
    for label in dict.fromkeys(c.row_name() for c in cells):
        group = [c for c in cells if c.row_name() == label]
        out_len = _measure(group[0]).output_len
        lat, hits = [], []
        for s in scenarios:
            mine = [c for c in group if (c.scenario or "") == s]
            if not mine:
                lat.append("-")
                hits.append("-")
                continue
            lat.append(" / ".join(_ms(_mean_of(mine, f"mean_{m}_ms")) for m in ("ttft", "tpot", "e2el")))
            one = _measure(mine[0])
            hits.append(_pct(_rate(one, "hit_rate") if prefix_only else one.first_leg()))
        ideal = "" if prefix_only else f" {_pct(group[0].ideal())} |"
        lines.append(f"| {label} | {out_len} | " + " | ".join(lat) + " | " + " | ".join(hits) + " |" + ideal)
    return "\n".join(lines) + "\n"


def _measure(cell: Cell) -> Phase:
    assert cell.measure is not None  # suite_markdown's cells are measured ones
    return cell.measure


def check_plot_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UcmctlError.one(
            "--plot needs matplotlib, which is not installed",
            key="--plot",
            fix="pip install matplotlib, or drop --plot",
        ) from None


def save_plot(cells: Cells, path: Path) -> None:
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
                    ax.axhline(
                        row[key],
                        linestyle="--",
                        color=line.get_color(),
                        alpha=0.7,
                        label=f"{scenario or 'run'} {row['label']}",
                    )
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
def print_cells(cells: Cells, console: Console) -> None:
    """Two tables (latencies; throughput and hit rates), then each phase's lines of every
    per-phase extra (`bench/extras/`: failures, preemptions, processes lost, the KV handover,
    the fault, store errors, goodput, trace lag, hit rates by role and unread /metrics).
    A figure nothing measured (every request of the phase failed) shows as `-`."""
    cells = cells_of(cells)
    has_scenario = any(c.scenario for c in cells)
    has_point = any(c.point_name for c in cells)
    prefix_only = all(c.workload_name() == "prefix" for c in cells)
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
    title = "throughput and hit rate (measured local, external" + (
        "; asked)" if prefix_only else ", first leg's whole; ideal)"
    )
    for t in fitted(console, title, head, load_cols, load):
        console.print(t)
        console.print()
    say = functools.partial(console.print, soft_wrap=False)  # messages wrap at the width
    for cell in cells:
        for key, phase in cell.phases():
            row = cell.row_name()
            view = PhaseView(key, f"{phase_name(cell, key)} {row}", row, cell, phase)
            for note in extras.notes(view):
                say(note.text, style=note.style, markup=note.markup)


def _table_rows(
    cells: list[Cell], has_scenario: bool, has_point: bool, prefix_only: bool
) -> tuple[list[list[str]], list[list[str]]]:
    """The rows of the two tables: (latencies, throughput and hit rates), a row per phase."""
    latency, load = [], []
    for cell in cells:
        for phase, p in cell.phases():
            first = [cell.scenario or ""] if has_scenario else []
            first += [cell.point_name or ""] if has_point else []
            first += [
                cell.label_name() + (f" #{cell.repeat + 1}" if cell.repeat else ""),
                phase_name(cell, phase),
            ]
            failed = f"[red]{p.failed}[/]" if p.failed else "0"
            pairs = (f"{_ms(p.value(f'mean_{m}_ms'))} / {_ms(p.value(f'p99_{m}_ms'))}" for m in METRICS)
            latency.append([*first, *pairs])
            requested = _pct(cell.ideal()) if phase == "measure" else "-"
            measured = p.completed > 0
            load.append(
                [
                    *first,
                    str(p.completed),
                    failed,
                    f"{p.request_throughput:.2f}" if measured else "-",
                    f"{p.output_throughput:.1f}" if measured else "-",
                    _pct(_rate(p, "local_hit_rate")),
                    _pct(_rate(p, "external_hit_rate")),
                    *([] if prefix_only else [_pct(p.first_leg())]),
                    requested,
                ]
            )
    return latency, load
