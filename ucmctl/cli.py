"""The `ucmctl` command line: a thin layer over the topology, plan and deploy modules."""

from __future__ import annotations

import shlex
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

from ucmctl import __version__
from ucmctl.bench.commands import app as bench_app
from ucmctl.bench.commands import spread_option_values

if TYPE_CHECKING:
    from ucmctl.plan.model import Plan
    from ucmctl.topology.model import Topology
from ucmctl.core.errors import ExitStatus, UcmctlError, report
from ucmctl.core.words import counted
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
app.command("proxy", short_help="Route requests to prefill/decode or mixed instances")(proxy_command)
# no emoji codes: a value such as /mnt/:smile: is printed as written
out = Console(highlight=False, soft_wrap=True, emoji=False)
err = Console(stderr=True, highlight=False, emoji=False)


class Format(str, Enum):
    text = "text"
    json = "json"


TopologyArg = typer.Argument(..., help="topology YAML file", show_default=False)


@app.command(short_help="Check a topology for the guides' pitfalls")
def validate(topology: Path = TopologyArg) -> None:
    """Check a topology for the guides' pitfalls without starting anything."""
    from ucmctl.plan.build import build_plan
    from ucmctl.topology.load import load_topology

    plan = build_plan(load_topology(topology))
    servers = sum(1 for p in plan.processes if p.is_server)
    sized = f"{counted(servers, 'API server')} on {counted(len(plan.nodes), 'node')}"
    out.print(f"{escape(str(topology))}: ok ({plan.mode}, {sized})")


@app.command(short_help="Print what `up` would run on every node")
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
        err.print(f"wrote {len(files)} files under {escape(str(out_dir))}")


@app.command(short_help="Write Kubernetes, Slurm or Prometheus files")
def render(
    topology: Path = TopologyArg,
    k8s: Path | None = typer.Option(
        None, "--k8s", help="write Kubernetes manifests into this folder, one per object"
    ),
    slurm: Path | None = typer.Option(
        None, "--slurm", help="write a self-contained sbatch script into this folder (needs a Slurm cluster)"
    ),
    namespace: str = typer.Option("default", "--namespace", help="--k8s: namespace of every object"),
    image: list[str] | None = typer.Option(
        None,
        "--image",
        help="--k8s: container image, or PLATFORM=IMAGE for one platform's pods (repeatable; "
        "default: ucmctl:<version>)",
    ),
    storage_class: str | None = typer.Option(
        None, "--storage-class", help="--k8s: StorageClass of the store's claim"
    ),
    store_size: str = typer.Option(
        "1Ti", "--store-size", help="--k8s: size the store's ReadWriteMany claim asks"
    ),
    prometheus: Path | None = typer.Option(
        None,
        "--prometheus",
        help="write a Prometheus scrape config (file-discovered targets), alert rules and Grafana "
        "dashboards into this folder; TOPOLOGY may also name a running deployment",
    ),
    scrape_interval: float = typer.Option(5.0, "--scrape-interval", min=0.1, help="--prometheus: seconds"),
) -> None:
    """Write the plan for a scheduler, never run by ucmctl: Kubernetes manifests (--k8s:
    LeaderWorkerSets, Deployments, Services, a ConfigMap, the store's claim) or
    an sbatch script (--slurm: the deployment as one batch job; `ucmctl down` stops it)."""
    from ucmctl.plan.build import build_plan

    if sum(x is not None for x in (k8s, slurm, prometheus)) != 1:
        raise UcmctlError.one("ucmctl render: pass exactly one of --k8s DIR, --slurm DIR or --prometheus DIR")
    if prometheus is not None:
        from ucmctl.monitor.prometheus import render as render_prometheus
        from ucmctl.monitor.prometheus import write

        plan_of_it = _running_plan(topology) or build_plan(_load(topology))
        files = write(render_prometheus(plan_of_it, scrape_interval), prometheus)
        for path in files:
            out.print(escape(str(path)))
        config = shlex.quote(str(prometheus / "prometheus.yml"))
        out.print(f"wrote {len(files)} files under {escape(str(prometheus))}: run `prometheus "
                  f"--config.file={escape(config)}`; import the dashboards/ into Grafana")  # fmt: skip
        return
    topo = _load(topology)
    the_plan = build_plan(topo)
    if slurm is not None:
        from ucmctl.launch.sbatch import log_pattern, write_script

        if the_plan.cluster.kind != "slurm":
            raise UcmctlError.one("--slurm needs a Slurm cluster in the topology", file=str(topology),
                                  fix="add `cluster: {kind: slurm, partition: NAME}`")  # fmt: skip
        path = write_script(the_plan, slurm)
        out.print(escape(str(path)))
        out.print(f"wrote the sbatch script of {the_plan.deployment}: submit it with `sbatch "
                  f"{escape(shlex.quote(str(path)))}` (its output goes to {escape(log_pattern(the_plan))} "
                  f"in the folder sbatch runs from); stop it with `ucmctl down {escape(str(topology))}` "
                  "or `scancel`")  # fmt: skip
        return
    assert k8s is not None
    from ucmctl.k8s.render import Options, parse_images, render_manifests, restart_notes, write_manifests

    default_image, platform_images = parse_images(image or [])
    options = Options(namespace=namespace, image=default_image, platform_images=platform_images,
                      storage_class=storage_class, store_size=store_size)  # fmt: skip
    manifests = render_manifests(the_plan, options)
    for written in write_manifests(manifests, the_plan, k8s):
        out.print(escape(str(written)))
    out.print(f"wrote {len(manifests)} manifests under {escape(str(k8s))}: apply them with "
              f"`kubectl apply -f {escape(str(k8s))}` (needs the LeaderWorkerSet controller)")  # fmt: skip
    for note in restart_notes(the_plan):
        err.print(f"note: {escape(note)}", soft_wrap=True)


def _running_plan(name: Path) -> Plan | None:
    """The plan of the deployment `name` names when it is no file but a deployment of the record."""
    if name.exists() or "/" in str(name):
        return None
    from ucmctl.deploy.state import StateStore

    record = StateStore().load(str(name))
    return record.plan if record is not None else None


def _load(topology: Path) -> Topology:
    from ucmctl.topology.load import load_topology

    return load_topology(topology)


AcceptNewHostKeys = typer.Option(
    False,
    "--accept-new-host-keys",
    help="accept SSH host keys not yet in known_hosts, and record them there (a changed key is "
    "still refused)",
)


@app.command(short_help="Check the nodes, then start (or change) a deployment")
def up(
    topology: Path = TopologyArg,
    dry_run: bool = typer.Option(False, "--dry-run", help="print what would be done; touch nothing"),
    keep_on_failure: bool = typer.Option(False, "--keep-on-failure", help="leave a failed start running"),
    skip_preflight: bool = typer.Option(False, "--skip-preflight", help="start without checking the nodes"),
    health_timeout: float | None = typer.Option(None, "--health-timeout", help="seconds per process"),
    skip_kv_probe: bool = typer.Option(
        False, "--skip-kv-probe", help="do not prove with one request that KV reaches decode"
    ),
    accept_new_host_keys: bool = AcceptNewHostKeys,
    wait_allocation: float | None = typer.Option(
        None,
        "--wait-allocation",
        min=1,
        help="Slurm: seconds to wait for the allocation to start "
        "(default: the topology's cluster.wait_allocation, 300); then it is cancelled",
    ),
    drain_timeout: float = typer.Option(
        60.0,
        "--drain-timeout",
        min=0.0,
        help="when it is up already: seconds a server taken out or restarted may take for its requests",
    ),
) -> None:
    """Check the nodes, then start Mooncake, the servers and the proxy, each gated on health,
    then prove with one request through the proxy that KV reaches decode. Of a deployment that
    is up already: start what the topology adds, stop what it drops, restart (one at a time,
    drained first) the servers whose command line it changes; the rest keeps running."""
    from ucmctl.deploy.api import Options, deploy_up
    from ucmctl.plan.build import build_plan
    from ucmctl.plan.model import SlurmPlan
    from ucmctl.plan.show import print_plan

    topo = _load(topology)
    if dry_run:
        plan = build_plan(topo)
        first, reached = "", "SSH"
        if isinstance(plan.cluster, SlurmPlan):
            first = (f"take one Slurm allocation (job {plan.cluster.job_name(plan.deployment)} on "
                     f"{', '.join(plan.nodes)}; each process a job step), then ")  # fmt: skip
            reached = "Slurm steps"
        out.print(f"dry run: nothing is touched. `up` would {first}check {len(plan.nodes)} nodes ({reached}, "
                  "Python, engine, connector, devices, /dev/shm and RAM, ports, shared storage), place the "
                  "files below, then start stage by stage:")  # fmt: skip
        for i, stage in enumerate(plan.stages()):
            out.print(f"  stage {i}: " + ", ".join(f"{p.name}@{p.node}" for p in stage))
        print_plan(plan, out)
        return
    options = Options(keep_on_failure=keep_on_failure, skip_preflight=skip_preflight,
                      health_timeout=health_timeout, kv_probe=not skip_kv_probe,
                      accept_new_host_keys=accept_new_host_keys, wait_allocation=wait_allocation,
                      drain_timeout=drain_timeout)  # fmt: skip
    record = deploy_up(topo, str(topology.resolve()), options=options, console=err)
    proxy = next((p.url for p in record.plan.processes if p.role == "proxy"), None)
    out.print(f"deployment {record.deployment} is up: {counted(len(record.plan.processes), 'process')}"
              + (f", proxy {proxy}" if proxy else ""))  # fmt: skip


@app.command(short_help="Stop everything a deployment started")
def down(
    target: str | None = typer.Argument(
        None, help="deployment name, or its topology file (default: the only deployment)", show_default=False
    ),
    purge_storage: bool = typer.Option(False, "--purge-storage", help="also delete the stored KV blocks"),
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask before purging"),
    grace: float = typer.Option(15.0, "--grace", help="seconds between SIGTERM and SIGKILL"),
) -> None:
    """Stop everything a deployment started (and nothing else), in reverse order."""
    from ucmctl.deploy.api import deploy_down, purge
    from ucmctl.deploy.state import StateStore

    if target is None:
        from ucmctl.deploy.inspect import the_deployment

        target = the_deployment("down", alternative="or pass the topology file")
    as_file = Path(target)
    plan: Plan | None = None
    if target.endswith((".yaml", ".yml")) or as_file.is_file():
        from ucmctl.plan.build import build_plan

        plan = build_plan(_load(as_file))
    else:
        record = StateStore().load(target)  # read before `down` removes it: what to purge
        if record is not None:
            plan = record.plan
    stopped = deploy_down(plan or target, grace=grace, console=err)
    for name, node, was_running in stopped:
        out.print(f"{name}@{node}: {'stopped' if was_running else 'not running'}")
    out.print(f"{counted(sum(1 for s in stopped if s[2]), 'process')} stopped")
    if purge_storage:
        assert plan is not None  # deploy_down refused an unknown name
        if plan.store is None:
            raise UcmctlError.one(f"deployment '{plan.deployment}' has no storage to purge")
        where = ", ".join(plan.store.backends)
        if not yes and not typer.confirm(f"delete every stored KV block under {where}?"):
            raise typer.Exit(int(ExitStatus.OK))
        removed = purge(plan)
        out.print(f"purged {removed} block folders under {escape(where)}")


@app.command(short_help="Every process: its state, health and restarts")
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


@app.command(short_help="The processes' logs, from every node")
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

    record, names = _deployment_and_processes("logs", deployment, processes)
    show_logs(record, names, lines, follow, out)


def _deployment_and_processes(
    command: str, deployment: str | None, processes: list[str] | None
) -> tuple[Any, list[str]]:
    """The record of DEPLOYMENT and the PROCESS names after it, checked (exit 2). The name may
    be left out when this machine has one deployment: `ucmctl logs prefill-0` names a process
    of it, not a deployment."""
    from ucmctl.deploy.state import StateStore

    store = StateStore()
    names = list(processes or [])
    record = None
    if deployment is None:
        from ucmctl.deploy.inspect import the_deployment

        deployment = the_deployment(command)
    elif not _is_name(deployment) or store.load(deployment) is None:
        only = store.all()
        if len(only) == 1:
            known = [p.name for p in only[0].plan.processes]
            if deployment not in known:
                raise UcmctlError.one(
                    f"'{deployment}' is neither a deployment on this machine nor a process of "
                    f"{only[0].deployment}",
                    fix=f"its processes: {', '.join(known)}",
                )
            names.insert(0, deployment)
            deployment = only[0].deployment
    if _is_name(deployment):
        record = store.load(deployment)
    if record is None:
        raise UcmctlError.one(
            f"no deployment named '{deployment}' on this machine", fix="see `ucmctl status`"
        )
    known = [p.name for p in record.plan.processes]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UcmctlError.one(
            f"no process {', '.join(unknown)} in {deployment}", fix=f"known: {', '.join(known)}"
        )
    return record, names


@app.command(short_help="Restart servers without losing a request")
def restart(
    deployment: str | None = typer.Argument(
        None, help="deployment name (default: the only deployment)", show_default=False
    ),
    processes: list[str] | None = typer.Argument(None, help="process names (default: every API server)"),
    rolling: bool = typer.Option(False, "--rolling", help="one process at a time"),
    drain_timeout: float = typer.Option(
        60.0, "--drain-timeout", min=0.0, help="seconds a drained server's requests in flight may take"
    ),
    grace: float = typer.Option(15.0, "--grace", help="seconds between SIGTERM and SIGKILL"),
    force: bool = typer.Option(
        False, "--force", help="restart even when no other instance of its role is left in routing"
    ),
) -> None:
    """Restart processes of a running deployment: each server drained at the proxy (its requests
    in flight finish), stopped, started, gated on its health, then routed to again."""
    from ucmctl.deploy.restart import restart as restart_processes

    record, names = _deployment_and_processes("restart", deployment, processes)
    done = restart_processes(record.deployment, names, rolling=rolling, drain_timeout=drain_timeout,
                             grace=grace, force=force, console=err)  # fmt: skip
    cut = sum(r.cut for r in done)
    out.print(
        f"{counted(len(done), 'process')} restarted"
        + (f"; {cut} request(s) cut at the drain timeout" if cut else "")
    )


@app.command(short_help="Add or take out instances of a running deployment")
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
    grace: float = typer.Option(15.0, "--grace", help="seconds between SIGTERM and SIGKILL"),
) -> None:
    """Add or take out instances of a running deployment, the others left running: a new one is
    started, gated on its health and added to the proxy; one taken out is drained first."""
    from ucmctl.deploy.scale import scale as scale_sides

    counts = {k: v for k, v in (("prefill", prefill), ("decode", decode), ("mixed", mixed)) if v is not None}
    if not counts:
        raise UcmctlError.one("say how many: --prefill N, --decode M (or --mixed N)")
    record, _ = _deployment_and_processes("scale", deployment, [])
    done = scale_sides(record.deployment, counts, drain_timeout=drain_timeout, grace=grace, console=err)
    parts = [
        f"added {', '.join(done.added)}" if done.added else "",
        f"took out {', '.join(done.removed)}" if done.removed else "",
    ]
    out.print("; ".join(x for x in parts if x) or "nothing changed")


def _is_name(text: str) -> bool:
    import re

    from ucmctl.core.names import NAME_RE

    return re.fullmatch(NAME_RE, text) is not None


@app.command(short_help="Install a ucmctl wheel on every node")
def install(
    topology: Path = TopologyArg,
    wheel: Path = typer.Option(..., "--wheel", help="the ucmctl wheel to install on every node"),
    no_deps: bool = typer.Option(False, "--no-deps", help="install only the wheel (offline nodes)"),
    accept_new_host_keys: bool = AcceptNewHostKeys,
) -> None:
    """Push a ucmctl wheel to every node of a topology and install it into the node's Python."""
    from ucmctl.deploy.api import install_wheel
    from ucmctl.plan.build import build_plan

    if not wheel.is_file() or wheel.suffix != ".whl":
        raise UcmctlError.one(f"{wheel} is not a wheel file", fix="build one with `pip wheel . -w dist`")
    for node, line in install_wheel(
        build_plan(_load(topology)), wheel, no_deps=no_deps, accept_new_host_keys=accept_new_host_keys
    ):
        out.print(f"{node}: {escape(line)}")


image_app = typer.Typer(
    rich_markup_mode=None, help="Container images of a topology's processes.", no_args_is_help=True
)
app.add_typer(image_app, name="image")


@image_app.command("build", short_help="Build each node's image of the topology")
def image_build(topology: Path = TopologyArg, accept_new_host_keys: bool = AcceptNewHostKeys) -> None:
    """Build, on each node that runs one, the image derived from the topology's `container.image`
    with this ucmctl's wheel (connector, native store, proxy) added; reused when it holds it."""
    from ucmctl.deploy.images import build_images, derived_images
    from ucmctl.plan.build import build_plan

    plan = build_plan(_load(topology))
    if not derived_images(plan):
        raise UcmctlError.one(
            f"topology '{plan.deployment}' runs no derived image",
            fix="set container.runtime (podman or docker) and container.image on a node or side",
        )
    for b in build_images(plan, accept_new_host_keys=accept_new_host_keys):
        said = "already holds this ucmctl" if b.reused else f"built in {b.seconds:.1f} s"
        out.print(f"{b.node}: {escape(b.image)} {said}")


@app.command(short_help="Print the topology file reference or its JSON Schema")
def schema(
    format: Format = typer.Option(Format.text, "--format", "-f", help="text (Markdown) or json"),
) -> None:
    """Print the topology file reference (Markdown) or its JSON Schema."""
    from ucmctl.topology.schema_doc import json_schema, markdown

    sys.stdout.write(json_schema() if format is Format.json else markdown())


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
