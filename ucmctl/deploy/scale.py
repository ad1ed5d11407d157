"""`ucmctl scale`: instances added to or taken out of a running deployment, the others left
running (their HBM caches kept).

The new layout is the topology's with the side's server count changed on its last node, so
every process that stays keeps its name, ports and devices; a change that would move one (a
data-parallel side, another side's devices shifting on a shared node) is refused. Taking a
server out: drained at the proxy (its requests in flight finish, up to the drain timeout),
removed from it, stopped. Adding one: staged, started, gated on its health, then added to the
proxy. The record then holds the new plan, so `status`, `restart` and `down` see exactly what
runs; the proxy's launch script on its node is rewritten with the new instance list (it takes
effect at its next start)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape

from ucmctl.core.errors import ExitStatus, UcmctlError
from ucmctl.deploy.health import wait_healthy
from ucmctl.deploy.restart import Proxy, proxy_of, reach, running_record
from ucmctl.deploy.staging import stage_node
from ucmctl.deploy.state import ProcessState, Record, StateStore
from ucmctl.launch import Launcher, launcher_for
from ucmctl.nodes.executor import NodeError
from ucmctl.nodes.fanout import parallel
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan, Process
from ucmctl.topology.load import load_topology, parse_topology
from ucmctl.topology.model import Mode, Topology

# Fields of a process that may differ between the two plans without it being another process:
# none for servers; the proxy's command line lists the instances.
_MAY_CHANGE = {"proxy"}


@dataclass(frozen=True)
class Scaled:
    added: list[str]
    removed: list[str]
    cut: int  # requests still in flight at the drain timeout of a removed server


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
    drain_timeout: float,
    grace: float,
    console: Console | None = None,
    store: StateStore | None = None,
    say: Callable[[str], None] | None = None,
) -> Scaled:
    """Add or take out instances of a running deployment's sides, the others left running."""
    console = console or Console(stderr=True, emoji=False)
    store = store or StateStore()
    tell = say or (lambda line: console.print(escape(line), soft_wrap=True))
    with store.lock(deployment, "scale"):
        record = running_record(store, deployment)
        new = build_plan(scaled_topology(record, counts))
        old = record.plan
        added, removed = _diff(old, new)
        if not added and not removed:
            tell("nothing to change: the sides have these counts")
            return Scaled([], [], 0)
        proxy = proxy_of(record)
        launcher = launcher_for(new, record.allocation, connect_timeout=10)
        try:
            reach(launcher, [*removed, *[p for p in new.processes if p.node in {a.node for a in added}]])
            cut = sum(parallel(removed, lambda p: _take_out(launcher, proxy, p, drain_timeout, grace, tell)))
            record.plan = new
            for p in removed:
                record.processes.pop(p.name, None)
            store.save(record)  # what runs now: `down` must not look for what was stopped
            try:
                _bring_in(launcher, record, store, added, proxy, tell)
            except UcmctlError as exc:
                _roll_back(launcher, record, store, old, counts, added, proxy, grace)
                raise UcmctlError.one(
                    f"{exc.problems[0].message}; the instances this scale added are stopped again",
                    status=ExitStatus.FAILURE,
                    fix=f"see the log lines above; `ucmctl status {record.deployment}` shows what runs",
                ) from None
            _restage_changed(launcher, old, new)
        finally:
            launcher.close()
    return Scaled([p.name for p in added], [p.name for p in removed], cut)


def _roll_back(
    launcher: Launcher, record: Record, store: StateStore, old: Plan, counts: dict[str, int],
    added: list[Process], proxy: Proxy | None, grace: float,
) -> None:  # fmt: skip
    """All or nothing for what this scale added: out of the proxy, stopped, out of the record
    (what it took out stays out)."""
    for p in added:
        with contextlib.suppress(UcmctlError, NodeError):
            if proxy is not None:
                proxy.remove(p)
        with contextlib.suppress(NodeError):
            launcher.stop(p, grace=grace)
        record.processes.pop(p.name, None)
    had = {side: sum(1 for p in old.processes if p.role == side) for side in counts}
    kept = {side: n for side, n in counts.items() if n <= had[side]}  # the sides it shrank
    record.plan = build_plan(scaled_topology(record.model_copy(update={"plan": old}), kept)) if kept else old
    store.save(record)


def _diff(old: Plan, new: Plan) -> tuple[list[Process], list[Process]]:
    """(added, removed); a process of both plans that would change is refused (exit 2)."""
    before = {p.name: p for p in old.processes}
    after = {p.name: p for p in new.processes}
    for name in before.keys() & after.keys():
        if name not in _MAY_CHANGE and before[name] != after[name]:
            raise UcmctlError.one(
                f"this scale would change {name} (its command line, devices or files), not only "
                "add or take out instances",
                fix="use `ucmctl down` and `up` with the new topology",
            )
    return [after[n] for n in after if n not in before], [before[n] for n in before if n not in after]


def _take_out(
    launcher: Launcher,
    proxy: Proxy | None,
    p: Process,
    drain_timeout: float,
    grace: float,
    tell: Callable[[str], None],
) -> int:
    t0 = time.monotonic()
    cut = 0
    if proxy is not None:
        cut = proxy.drain(p, drain_timeout)
        proxy.remove(p)
    try:
        launcher.stop(p, grace=grace)
    except NodeError as exc:
        raise UcmctlError.one(
            f"could not stop {p.name} on {p.node}: {exc.reason}",
            status=ExitStatus.FAILURE,
            fix="it is out of routing; check the node, then `ucmctl scale` again",
        ) from None
    tell(
        f"{p.name} on {p.node}: taken out in {time.monotonic() - t0:.1f} s"
        + (f" ({cut} request(s) still in flight at --drain-timeout: cut)" if cut else "")
    )
    return cut


def _bring_in(
    launcher: Launcher,
    record: Record,
    store: StateStore,
    added: list[Process],
    proxy: Proxy | None,
    tell: Callable[[str], None],
) -> None:
    for node in sorted({p.node for p in added}):
        running = stage_node(launcher[node], [p for p in added if p.node == node])
        if running:
            raise UcmctlError.one(
                f"{', '.join(running)} already run(s) on {node}",
                status=ExitStatus.NOT_READY,
                fix="`ucmctl down` the deployment",
            )

    def start(p: Process) -> str | None:
        t0 = time.monotonic()
        record.processes[p.name] = ProcessState(name=p.name, node=p.node)
        try:
            started = launcher.start(p)
        except NodeError as exc:
            return exc.reason
        record.processes[p.name].pgid, record.processes[p.name].started_at = started.pgid, time.time()
        store.save(record)
        reason = wait_healthy(
            p.health, timeout=p.health_timeout, still_alive=lambda: launcher.alive(p) is not None
        )
        if reason is None and proxy is not None:
            proxy.add(p)
            tell(f"{p.name} on {p.node}: added in {time.monotonic() - t0:.1f} s")
        return reason

    failed = [(p, r) for p, r in zip(added, parallel(added, start), strict=True) if r is not None]
    if failed:
        p, reason = failed[0]
        tail = launcher.log_tail(p, 20)
        raise UcmctlError.one(
            f"{p.name} on node {p.node} did not come up: {reason}"
            + (f"; its last log lines:\n{tail}" if tail else ""),
            status=ExitStatus.FAILURE,
            fix=f"it is not in routing; `ucmctl logs {record.deployment} {p.name}`, then scale again",
        )


def _restage_changed(launcher: Launcher, old: Plan, new: Plan) -> None:
    """Rewrite the files that changed of processes that kept running (the proxy's launch script
    lists the instances): what they run with at their next start."""
    before = {p.name: p for p in old.processes}
    for p in new.processes:
        was = before.get(p.name)
        if was is None or was == p:
            continue
        kept = {f.path: f.content for f in was.files}
        for f in p.files:
            if kept.get(f.path) != f.content:
                launcher[p.node].put(f.path, f.content, f.mode)
