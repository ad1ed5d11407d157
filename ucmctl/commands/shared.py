"""What the commands share: the consoles they print on, the topology argument and the host-key
option, and the look-ups of a topology file, a deployment and its processes."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from ucmctl.core.errors import UcmctlError

if TYPE_CHECKING:
    from ucmctl.plan.model import Plan
    from ucmctl.topology.model import Topology

# no emoji codes: a value such as /mnt/:smile: is printed as written
out = Console(highlight=False, soft_wrap=True, emoji=False)
err = Console(stderr=True, highlight=False, emoji=False)


class Format(str, Enum):
    text = "text"
    json = "json"


TopologyArg = typer.Argument(..., help="topology YAML file", show_default=False)

MoveAfter = typer.Option(
    2.0,
    "--move-after",
    min=0.0,
    help="seconds before a drained server's streamed answers move to other instances (they go on from "
    "the store)",
)

AcceptNewHostKeys = typer.Option(
    False,
    "--accept-new-host-keys",
    help="accept SSH host keys not yet in known_hosts, and record them there (a changed key is "
    "still refused)",
)


def running_plan(name: Path) -> Plan | None:
    """The plan of the deployment `name` names when it is no file but a deployment of the record."""
    if name.exists() or "/" in str(name):
        return None
    from ucmctl.deploy.state import StateStore

    record = StateStore().load(str(name))
    return record.plan if record is not None else None


def topology_of(topology: Path) -> Topology:
    """The topology file, loaded and checked (the loader imported by the commands that read one)."""
    from ucmctl.topology.load import load_topology

    return load_topology(topology)


def deployment_and_processes(
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
    elif not is_name(deployment) or store.load(deployment) is None:
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
    if is_name(deployment):
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


def is_name(text: str) -> bool:
    import re

    from ucmctl.core.names import NAME_RE

    return re.fullmatch(NAME_RE, text) is not None
