"""`ucmctl bench history`: the runs of the results history that match, then a trend table per
cell (one row per run), fitted to the terminal; `--plot DIR` draws one trend figure per metric."""

from __future__ import annotations

import fnmatch
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ucmctl.bench.history import CellRow, Run
from ucmctl.core.tables import FIGURE, NAME, PAIR, fitted, plain

# The trend table's columns: (header, figures joined by " / ", digits).
TREND = (
    ("TTFT mean / p99", ("ttft_mean", "ttft_p99"), 1),
    ("TPOT mean / p99", ("tpot_mean", "tpot_p99"), 2),
    ("E2EL mean", ("e2el_mean",), 1),
    ("tok/s", ("output_throughput",), 1),
    ("hit", ("hit_rate",), None),
)


UNITS = {"output": "tokens/s", "request": "requests/s", "hit": "share of prompt tokens"}


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _fig(value: float | None, digits: int | None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if digits is None else f"{value:.{digits}f}"


def print_runs(runs: list[Run], console: Console) -> None:
    rows = [
        [
            f"#{r.id}",
            when(r.created_at),
            r.deployment or "-",
            r.workload,
            r.label or "-",
            str(r.failed) if not r.lost else f"{r.failed}, lost {r.lost}",
            r.ucmctl_version or "-",
            r.provenance_key[:8],
        ]
        for r in runs
    ]
    lead = [("run", FIGURE), ("when", FIGURE)]
    columns = [
        ("deployment", NAME),
        ("workload", NAME),
        ("label", NAME),
        ("failed", FIGURE),
        ("ucmctl", NAME),
        ("key", NAME),
    ]
    _print(console, f"runs ({len(runs)}, oldest first)", lead, columns, rows)


def _print(
    console: Console,
    title: str,
    lead: list[tuple[str, str]],
    columns: list[tuple[str, str]],
    rows: list[list[str]],
) -> None:
    """As text where every cell fits on one line (fast for a thousand runs), else as rich's
    tables that wrap (a label as typed: never read as markup)."""
    text = plain(title, lead + columns, rows, console.width)
    if text is not None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        console.print()
        return
    for t in fitted(console, title, lead, columns, [[escape(c) for c in r] for r in rows]):
        console.print(t)
        console.print()


def by_cell(cells: list[CellRow], pattern: str | None) -> dict[str, list[CellRow]]:
    """The cells' rows by cell name, in order of first appearance; `pattern` (a glob) filters."""
    out: dict[str, list[CellRow]] = {}
    for c in cells:
        if pattern is None or fnmatch.fnmatchcase(c.cell, pattern):
            out.setdefault(c.cell, []).append(c)
    return out


def print_trends(runs: list[Run], cells: dict[str, list[CellRow]], console: Console) -> None:
    started = {r.id: r.created_at for r in runs}
    for name, rows_ in cells.items():
        table_rows = []
        for c in rows_:
            repeat = f" #{c.repeat + 1}" if c.repeat else ""
            figures = [" / ".join(_fig(c.figures[k], digits) for k in keys) for _, keys, digits in TREND]
            if c.failed or c.lost:
                figures[-1] += f" ({c.failed} failed{', lost' if c.lost else ''})"
            table_rows.append([f"#{c.run_id}{repeat}", when(started[c.run_id])[5:], *figures])
        columns = [(h, PAIR if " / " in h else FIGURE) for h, _, _ in TREND]
        _print(
            console,
            f"trend of {name} (ms; tok/s out)",
            [("run", FIGURE), ("when", FIGURE)],
            columns,
            table_rows,
        )


def save_trend_plots(
    runs: list[Run], cells: dict[str, list[CellRow]], folder: Path, metrics: list[str]
) -> list[Path]:
    """One PNG per metric in `folder`: each cell's figure by run, in time order. A cell with a
    single run is a bar (a line through one point draws nothing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    order = {r.id: i for i, r in enumerate(runs)}
    labels = [f"#{r.id}" for r in runs]
    written = []
    for metric in metrics:
        fig, ax = plt.subplots(figsize=(9, 4.2))
        for name, rows_ in cells.items():
            points = [(order[c.run_id], c.figures[metric]) for c in rows_ if c.figures[metric] is not None]
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            if len(set(xs)) == 1:
                ax.bar(xs, ys, width=0.4, label=name, alpha=0.6)
            else:
                ax.plot(xs, ys, marker="o", label=name)
        ax.set_xticks(range(len(runs)), labels, rotation=45 if len(runs) > 12 else 0, fontsize=8)
        ax.set_xlabel("run")
        ax.set_ylabel(f"{metric} ({UNITS.get(metric.split('_')[0], 'ms')})")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{metric} by run")
        ax.grid(alpha=0.3)
        if cells:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = folder / f"{metric}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
