"""`ucmctl bench history`: the stored runs that match, each cell's trend, and their plots."""

from __future__ import annotations

from pathlib import Path

import typer

from ucmctl.bench.commands.common import err, out
from ucmctl.bench.history import METRICS as METRIC_NAMES
from ucmctl.core.errors import UcmctlError


def history_command(
    deployment: str | None = typer.Option(None, "--deployment", "-d", help="runs against this deployment"),
    workload: str | None = typer.Option(None, "--workload", "-w", help="prefix, multi-turn, trace, long-doc"),
    label: str | None = typer.Option(None, "--label", help="runs given this --label"),
    since: str | None = typer.Option(None, "--since", help="e.g. 7d, 12h, 2026-12-01"),
    key: str | None = typer.Option(
        None, "--key", help="runs of this provenance key (its first 8+ characters)"
    ),
    last: int = typer.Option(20, "--last", min=1, help="the last N runs that match"),
    cell: str | None = typer.Option(
        None, "--cell", help="trends of the cells matching this glob, e.g. 'ucm/*'"
    ),
    history_file: str | None = typer.Option(
        None, "--history", help="the history file (default $UCMCTL_HISTORY, else ~/.ucmctl/history.sqlite)"
    ),
    plot: Path | None = typer.Option(None, "--plot", help="folder: a trend figure (PNG) per metric"),
    metric: str = typer.Option(
        "ttft_mean,tpot_mean,e2el_mean,output_throughput,hit_rate",
        "--metric",
        help="--plot's metrics, of: " + ", ".join(METRIC_NAMES),
    ),
) -> None:
    """The runs of the results history that match (oldest first), then each cell's trend."""
    from ucmctl.bench import history, history_view

    path = history.resolve(history_file) or history.default_path()
    metrics = [m.strip() for m in metric.split(",") if m.strip()]
    unknown = [m for m in metrics if m not in METRIC_NAMES]
    if unknown or not metrics:
        raise UcmctlError.one(
            f"unknown metric '{', '.join(unknown)}'",
            key="--metric",
            fix="one or more of " + ", ".join(METRIC_NAMES),
        )
    if key is not None and len(key) < 8:
        raise UcmctlError.one(
            "a provenance key is 8 or more characters", key="--key", fix="copy it from the list"
        )
    if plot:
        from ucmctl.bench.report import check_plot_available

        check_plot_available()
        if plot.exists() and not plot.is_dir():
            raise UcmctlError.one(
                "is a file, not a folder", file=str(plot), key="--plot", fix="name a folder"
            )
    found = history.runs(
        path,
        history.Filter(
            deployment=deployment,
            workload=workload,
            label=label,
            since=history.parse_since(since) if since else None,
            key=key,
            last=last,
        ),
    )
    if not found:
        said = f"no run in {path} matches" if path.exists() else f"no results history yet at {path}"
        out.print(said, markup=False, highlight=False)
        return
    cells = history_view.by_cell(history.cells(path, [r.id for r in found]), cell)
    history_view.print_runs(found, out)
    history_view.print_trends(found, cells, out)
    if plot:
        for written in history_view.save_trend_plots(found, cells, plot, metrics):
            err.print(f"wrote {written}", markup=False, highlight=False)
