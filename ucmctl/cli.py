"""The `ucmctl` command line: a thin layer over the topology, plan and deploy modules."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from ucmctl import __version__
from ucmctl.errors import ExitStatus, UcmctlError
from ucmctl.model.cli import app as model_app
from ucmctl.sim.cli import app as sim_app

app = typer.Typer(
    name="ucmctl",
    help="Deploy and measure vLLM with the UCM KV-cache store.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(model_app, name="model")
app.add_typer(sim_app, name="sim")
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


class Format(str, Enum):
    text = "text"
    json = "json"


TopologyArg = typer.Argument(..., help="topology YAML file", show_default=False)


@app.command()
def validate(topology: Path = TopologyArg) -> None:
    """Check a topology for the guides' pitfalls without starting anything."""
    from ucmctl.plan.build import build_plan
    from ucmctl.topology.load import load_topology

    plan = build_plan(load_topology(topology))
    servers = sum(1 for p in plan.processes if p.role in ("prefill", "decode", "mixed"))
    out.print(f"{topology}: ok ({plan.mode}, {servers} API servers on {len(plan.nodes)} nodes)")


@app.command()
def plan(
    topology: Path = TopologyArg,
    format: Format = typer.Option(Format.text, "--format", "-f", help="text or json"),
    out_dir: Path | None = typer.Option(None, "--out", help="write the rendered files here"),
) -> None:
    """Print what `up` would run on every node; optionally write the rendered files."""
    from ucmctl.plan.build import build_plan
    from ucmctl.plan.show import plan_json, print_plan, write_bundle
    from ucmctl.topology.load import load_topology

    the_plan = build_plan(load_topology(topology))
    if format is Format.json:
        sys.stdout.write(plan_json(the_plan))
    else:
        print_plan(the_plan, out)
    if out_dir is not None:
        files = write_bundle(the_plan, out_dir)
        err.print(f"wrote {len(files)} files under {out_dir}")


@app.callback(invoke_without_command=True)
def _root(
    version: bool = typer.Option(False, "--version", help="print the version and exit"),
) -> None:
    if version:
        out.print(f"ucmctl {__version__}")
        raise typer.Exit()


def main() -> None:
    """Entry point: user errors become one line each and exit code 2, never a traceback."""
    try:
        app(standalone_mode=False)
    except UcmctlError as exc:
        for problem in exc.problems:
            err.print(f"[red]error:[/] {escape(problem.render())}", soft_wrap=True)
        sys.exit(int(exc.status))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print("interrupted")
        sys.exit(int(ExitStatus.INTERRUPTED))
    except typer.TyperException as exc:  # usage errors: unknown option, missing argument
        exc.show()  # type: ignore[attr-defined]
        sys.exit(int(ExitStatus.BAD_INPUT))
