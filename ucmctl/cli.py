"""The `ucmctl` command line: a thin layer over the topology, plan and deploy modules. Here the
commands (`ucmctl.commands`) are put together in the order `ucmctl --help` lists them, and
`main` is the one place where errors become what the user sees."""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from ucmctl import __version__
from ucmctl.bench.commands import app as bench_app
from ucmctl.bench.commands import spread_option_values
from ucmctl.commands import deploying, planning, running
from ucmctl.commands.shared import err, out
from ucmctl.core.errors import ExitStatus, report
from ucmctl.proxy.cli import proxy as proxy_command
from ucmctl.sim.cli import app as sim_app
from ucmctl.tinymodel.cli import app as model_app

app = typer.Typer(
    name="ucmctl",
    # click's help layout: it wraps every option's help at 80 columns, where rich's panels cut
    # the longer ones short with an ellipsis
    rich_markup_mode=None,
    help="Deploy and measure vLLM with the UCM KV-cache store.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(model_app, name="model")
app.add_typer(sim_app, name="sim")
app.add_typer(bench_app, name="bench")
image_app = typer.Typer(
    rich_markup_mode=None, help="Container images of a topology's processes.", no_args_is_help=True
)
app.add_typer(image_app, name="image")
image_app.command("build", short_help="Build each node's image of the topology")(deploying.image_build)

# The commands, in the order `ucmctl --help` lists them (before the groups above).
app.command("proxy", short_help="Route requests to prefill/decode or mixed instances")(proxy_command)
app.command(short_help="Check a topology for the guides' pitfalls")(planning.validate)
app.command(short_help="Print what `up` would run on every node")(planning.plan)
app.command(short_help="Write Kubernetes, Slurm or Prometheus files")(planning.render)
app.command(short_help="Check the nodes, then start (or change) a deployment")(deploying.up)
app.command(short_help="Stop everything a deployment started")(deploying.down)
app.command(short_help="Every process: its state, health and restarts")(running.status)
app.command(short_help="The processes' logs, from every node")(running.logs)
app.command(short_help="Restart servers without losing a request")(running.restart)
app.command(short_help="Add or take out instances of a running deployment")(running.scale)
app.command(short_help="Install a ucmctl wheel on every node")(deploying.install)
app.command(short_help="Print the topology file reference or its JSON Schema")(planning.schema)


@app.callback(invoke_without_command=True)
def _root(
    version: bool = typer.Option(False, "--version", help="print the version and exit"),
) -> None:
    if version:
        out.print(f"ucmctl {__version__}")
        raise typer.Exit()


def _usage_line(exc: Exception) -> str:
    """Click's usage error (three lines and a blank) as one: where, what, and where to look."""
    names: list[str] = []
    ctx = getattr(exc, "ctx", None)
    while ctx is not None and ctx.parent is not None:  # the root's name is how Python was run
        names.insert(0, str(ctx.info_name))
        ctx = ctx.parent
    path = " ".join(["ucmctl", *names])
    format_message = getattr(exc, "format_message", None)
    message = format_message() if callable(format_message) else str(exc)
    return f"{path}: {' '.join(str(message).split())} (see `{path} --help`)"


def _say(line: str) -> None:
    err.print(f"[red]error:[/] {escape(line)}", soft_wrap=True)


def main() -> None:
    """Entry point, and the one place where errors become what the user sees: each problem on
    one line (what, where, the fix), no traceback, and an exit status a script can act on (see
    ExitStatus: 2 bad input, 1 failed, 5 regression, 6 requests failed ...)."""
    try:
        args = spread_option_values(sys.argv[1:])  # --goodput ttft:500 tpot:50, as vLLM takes it
        code = app(args=args, standalone_mode=False)  # click returns a typer.Exit's code in this mode
        if isinstance(code, int) and code:
            sys.exit(code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print("interrupted")
        sys.exit(int(ExitStatus.INTERRUPTED))
    except typer.TyperException as exc:  # usage errors: unknown option, missing argument
        _say(_usage_line(exc))
        sys.exit(int(ExitStatus.BAD_INPUT))
    except Exception as exc:
        said = report(exc)  # every UcmctlError (nodes, launchers, configs ...), a file not found
        if said is None:
            raise  # a bug: its traceback
        for line in said[0]:
            _say(line)
        sys.exit(int(said[1]))
