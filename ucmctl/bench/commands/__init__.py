"""`ucmctl bench` (run, the default) and its `make-trace`, `suite`, `history` and `compare`
commands: one module each, their shared parts in `common`."""

from __future__ import annotations

import typer

from ucmctl.bench.commands import compare, history, make_trace, run, suite
from ucmctl.bench.commands.common import spread_option_values

app = typer.Typer(
    rich_markup_mode=None,
    help="Preseed-and-measure benchmarks, scenario suites and a regression gate.",
    short_help="Benchmarks, suites, the results history and the gate",
)
app.callback(invoke_without_command=True)(run.run)
app.command(
    "run",
    help="Send a workload and print its figures (also `ucmctl bench` alone).",
    short_help="Send a workload and print its figures",
)(run.run)
app.command("make-trace", short_help="Write a synthetic trace in Mooncake's format")(make_trace.make_trace)
app.command("suite", short_help="Run a matrix of input lengths x scenarios")(suite.suite)
app.command("history", short_help="The stored runs, their trends and plots")(history.history_command)
app.command("compare", short_help="Gate results against a baseline or the history")(compare.compare)

__all__ = ["app", "spread_option_values"]
