"""The commands on a running deployment: `status`, `logs`, `restart` and `scale`."""

from __future__ import annotations

import typer

from ucmctl.commands.shared import MoveAfter, deployment_and_processes, err, out
from ucmctl.core.errors import UcmctlError
from ucmctl.core.words import counted


def status(
    deployment: str | None = typer.Argument(None, help="one deployment (default: all)"),
    watch: bool = typer.Option(False, "--watch", "-w", help="look again every --interval s, until Ctrl-C"),
    interval: float = typer.Option(2.0, "--interval", min=0.5, help="seconds between looks with --watch"),
) -> None:
    """What runs: every process, its node, ports, health and uptime."""
    import time

    from rich.console import Group

    from ucmctl.deploy.inspect import status_table
    from ucmctl.deploy.state import StateStore

    store = StateStore()

    def frame() -> Group | None:
        records = [store.load(deployment)] if deployment else store.all()
        records = [r for r in records if r is not None]
        if not records:
            if deployment:
                raise UcmctlError.one(f"no deployment named '{deployment}' on this machine")
            return None
        return Group(*(t for record in records for t in status_table(record, width=out.width)))

    shown = frame()
    if not watch:
        out.print(shown if shown is not None else "no deployments")
        return
    if out.is_terminal:  # one frame, redrawn in place
        from rich.live import Live

        with Live(shown or "no deployments", console=out, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(frame() or "no deployments", refresh=True)
    while True:  # a pipe or a CI log: each look after the last, under the time it was taken
        out.print(f"--- {time.strftime('%H:%M:%S')}", markup=False)
        out.print(shown if shown is not None else "no deployments")
        time.sleep(interval)
        shown = frame()


def logs(
    deployment: str | None = typer.Argument(
        None, help="deployment name (default: the only deployment)", show_default=False
    ),
    processes: list[str] | None = typer.Argument(None, help="process names (default: all)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing new lines"),
    lines: int = typer.Option(50, "--lines", "-n", help="lines of each log to start with"),
) -> None:
    """Logs of a deployment's processes, from every node, prefixed with process@node."""
    from ucmctl.deploy.inspect import show_logs

    record, names = deployment_and_processes("logs", deployment, processes)
    show_logs(record, names, lines, follow, out)


def restart(
    deployment: str | None = typer.Argument(
        None, help="deployment name (default: the only deployment)", show_default=False
    ),
    processes: list[str] | None = typer.Argument(None, help="process names (default: every API server)"),
    rolling: bool = typer.Option(False, "--rolling", help="one process at a time"),
    drain_timeout: float = typer.Option(
        60.0, "--drain-timeout", min=0.0, help="seconds a drained server's requests in flight may take"
    ),
    move_after: float = MoveAfter,
    grace: float = typer.Option(15.0, "--grace", help="seconds between SIGTERM and SIGKILL"),
    force: bool = typer.Option(
        False, "--force", help="restart even when no other instance of its role is left in routing"
    ),
) -> None:
    """Restart processes of a running deployment: each server drained at the proxy (its streamed
    answers move to other instances, its other requests in flight finish), stopped, started,
    gated on its health, then routed to again."""
    from ucmctl.deploy.proxy_client import Drain
    from ucmctl.deploy.restart import restart as restart_processes

    record, names = deployment_and_processes("restart", deployment, processes)
    done = restart_processes(
        record.deployment,
        names,
        rolling=rolling,
        drain=Drain(drain_timeout, move_after),
        grace=grace,
        force=force,
        console=err,
    )
    cut = sum(r.cut for r in done)
    out.print(
        f"{counted(len(done), 'process')} restarted"
        + (f"; {cut} request(s) cut at the drain timeout" if cut else "")
    )


def scale(
    deployment: str | None = typer.Argument(
        None, help="deployment name (default: the only deployment)", show_default=False
    ),
    prefill: int | None = typer.Option(None, "--prefill", help="prefill instances wanted"),
    decode: int | None = typer.Option(None, "--decode", help="decode instances wanted"),
    mixed: int | None = typer.Option(None, "--mixed", help="mixed instances wanted"),
    drain_timeout: float = typer.Option(
        60.0, "--drain-timeout", min=0.0, help="seconds a removed server's requests in flight may take"
    ),
    move_after: float = MoveAfter,
    grace: float = typer.Option(15.0, "--grace", help="seconds between SIGTERM and SIGKILL"),
) -> None:
    """Add or take out instances of a running deployment, the others left running: a new one is
    started, gated on its health and added to the proxy; one taken out is drained first."""
    from ucmctl.deploy.proxy_client import Drain
    from ucmctl.deploy.scale import scale as scale_sides

    counts = {k: v for k, v in (("prefill", prefill), ("decode", decode), ("mixed", mixed)) if v is not None}
    if not counts:
        raise UcmctlError.one("say how many: --prefill N, --decode M (or --mixed N)")
    record, _ = deployment_and_processes("scale", deployment, [])
    drain = Drain(drain_timeout, move_after)
    done = scale_sides(record.deployment, counts, drain=drain, grace=grace, console=err)
    parts = [
        f"added {', '.join(done.added)}" if done.added else "",
        f"took out {', '.join(done.removed)}" if done.removed else "",
    ]
    out.print("; ".join(x for x in parts if x) or "nothing changed")
