"""The commands that change what runs on the nodes: `up`, `down`, `install` (a wheel on every
node) and `image build`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from ucmctl.commands.shared import AcceptNewHostKeys, MoveAfter, TopologyArg, err, out, topology_of
from ucmctl.core.errors import ExitStatus, UcmctlError
from ucmctl.core.words import counted

if TYPE_CHECKING:
    from ucmctl.plan.model import Plan


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
    move_after: float = MoveAfter,
) -> None:
    """Check the nodes, then start Mooncake, the servers and the proxy, each gated on health,
    then prove with one request through the proxy that KV reaches decode. Of a deployment that
    is up already: start what the topology adds, stop what it drops, restart (one at a time,
    drained first) the servers whose command line it changes; the rest keeps running."""
    from ucmctl.deploy.api import Options, deploy_up
    from ucmctl.deploy.proxy_client import Drain
    from ucmctl.plan.build import build_plan
    from ucmctl.plan.model import SlurmPlan
    from ucmctl.plan.show import print_plan

    topo = topology_of(topology)
    if dry_run:
        plan = build_plan(topo)
        first, reached = "", "SSH"
        if isinstance(plan.cluster, SlurmPlan):
            first = (
                f"take one Slurm allocation (job {plan.cluster.job_name(plan.deployment)} on "
                f"{', '.join(plan.nodes)}; each process a job step), then "
            )
            reached = "Slurm steps"
        out.print(
            f"dry run: nothing is touched. `up` would {first}check {len(plan.nodes)} nodes ({reached}, "
            "Python, engine, connector, devices, /dev/shm and RAM, ports, shared storage), place the "
            "files below, then start stage by stage:"
        )
        for i, stage in enumerate(plan.stages()):
            out.print(f"  stage {i}: " + ", ".join(f"{p.name}@{p.node}" for p in stage))
        print_plan(plan, out)
        return
    options = Options(
        keep_on_failure=keep_on_failure,
        skip_preflight=skip_preflight,
        health_timeout=health_timeout,
        kv_probe=not skip_kv_probe,
        accept_new_host_keys=accept_new_host_keys,
        wait_allocation=wait_allocation,
        drain=Drain(drain_timeout, move_after),
    )
    record = deploy_up(topo, str(topology.resolve()), options=options, console=err)
    doors = record.plan.proxy_words()
    out.print(
        f"deployment {record.deployment} is up: {counted(len(record.plan.processes), 'process')}"
        + (f", {doors}" if doors else "")
    )


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

        plan = build_plan(topology_of(as_file))
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
        build_plan(topology_of(topology)), wheel, no_deps=no_deps, accept_new_host_keys=accept_new_host_keys
    ):
        out.print(f"{node}: {escape(line)}")


def image_build(topology: Path = TopologyArg, accept_new_host_keys: bool = AcceptNewHostKeys) -> None:
    """Build, on each node that runs one, the image derived from the topology's `container.image`
    with this ucmctl's wheel (connector, native store, proxy) added; reused when it holds it."""
    from ucmctl.deploy.images import build_images, derived_images
    from ucmctl.plan.build import build_plan

    plan = build_plan(topology_of(topology))
    if not derived_images(plan):
        raise UcmctlError.one(
            f"topology '{plan.deployment}' runs no derived image",
            fix="set container.runtime (podman or docker) and container.image on a node or side",
        )
    for b in build_images(plan, accept_new_host_keys=accept_new_host_keys):
        said = "already holds this ucmctl" if b.reused else f"built in {b.seconds:.1f} s"
        out.print(f"{b.node}: {escape(b.image)} {said}")
