"""`ucmctl scale`: instances added to or taken out of a running deployment, the others left
running (their HBM caches kept).

The new layout is the topology's with the side's server count changed on its last node, so
every process that stays keeps its name, ports and devices; a change that would move one (a
data-parallel side, another side's devices shifting on a shared node) is refused. How
instances go and come: deploy/change.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape

from ucmctl.core.errors import UcmctlError
from ucmctl.deploy.change import Changed, apply, diff
from ucmctl.deploy.proxy_client import Drain
from ucmctl.deploy.restart import running_record
from ucmctl.deploy.state import Record, StateStore
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import load_topology, parse_topology
from ucmctl.topology.model import Mode, Topology


def scaled_topology(record: Record, counts: dict[str, int]) -> Topology:
    """The deployment's topology with each side's server count as asked, the change on the
    side's last node (exit 2 on a count the layout cannot take)."""
    path = Path(record.topology_path)
    if not path.is_file():
        raise UcmctlError.one(
            f"the topology file {path} of '{record.deployment}' is gone", fix="put it back where `up` read it"
        )
    topology = load_topology(path)
    if topology.digest() != record.topology_digest:
        raise UcmctlError.one(
            f"{path} changed since `up` of '{record.deployment}'",
            fix="scale what runs: restore the file, or `ucmctl down` and `up` the new one",
        )
    if topology.mode is Mode.p2p:
        raise UcmctlError.one(
            "scale of a p2p deployment is not supported yet: each Mooncake config names its peers' layout",
            fix="use `ucmctl down` and `up`",
        )
    data = topology.model_dump(mode="json", exclude_unset=True)
    for side_name, count in counts.items():
        side = getattr(topology, side_name, None)
        if side is None:
            raise UcmctlError.one(
                f"deployment '{record.deployment}' has no {side_name} side", key=f"--{side_name}"
            )
        if count < 1:
            raise UcmctlError.one(
                f"--{side_name} {count}: a side keeps at least 1 instance",
                key=f"--{side_name}",
                fix="take the deployment down with `ucmctl down`",
            )
        if side.dp > 1:
            raise UcmctlError.one(
                f"--{side_name}: its servers are one data-parallel engine group (dp "
                f"{side.dp}): scale by whole groups is not supported yet",
                key=f"--{side_name}",
            )
        now = [p for p in record.plan.processes if p.role == side_name]
        placement = {node: sum(1 for p in now if p.node == node) for node in side.nodes}
        last = side.nodes[-1]
        placement[last] += count - len(now)
        if placement[last] < 1:
            fewest = len(now) - sum(1 for p in now if p.node == last) + 1
            raise UcmctlError.one(
                f"--{side_name} {count}: instances are taken out of the side's last node, {last}, "
                "and it keeps one at least",
                key=f"--{side_name}",
                fix=f"ask for {fewest} or more, or `ucmctl down` and `up` a topology of fewer nodes",
            )
        data[side_name]["servers_per_node"] = placement
    return parse_topology(
        yaml.safe_dump(data, sort_keys=False), name=f"{path} (scaled)", base_dir=path.parent
    )


def scale(
    deployment: str,
    counts: dict[str, int],
    *,
    drain: Drain,
    grace: float,
    probe: bool = True,
    console: Console | None = None,
    store: StateStore | None = None,
    say: Callable[[str], None] | None = None,
) -> Changed:
    """Add or take out instances of a running deployment's sides, the others left running."""
    console = console or Console(stderr=True, emoji=False)
    store = store or StateStore()
    tell = say or (lambda line: console.print(escape(line), soft_wrap=True))
    with store.lock(deployment, "scale"):
        record = running_record(store, deployment)
        new = build_plan(scaled_topology(record, counts))
        d = diff(record.plan, new, restart_changed=False, how="this scale")
        if d.empty:
            tell("nothing to change: the sides have these counts")
            return Changed([], [], [], 0)
        return apply(record, store, new, d, drain=drain, grace=grace, tell=tell, probe=probe)
