"""A running deployment brought to another plan of itself, what stays left running (its HBM
cache kept): what `ucmctl scale` and an `up` of an edited topology do.

- added, first: checked as at `up` (ports, devices, the node's Python and connector), staged,
  started, gated on its health, proven to read what an instance that stays stored (the KV
  probe, centralized mode), then added to the proxy. All or nothing: when one does not come up,
  the others added are stopped again and nothing else is changed;
- taken out: drained at the proxy (requests in flight finish, up to the drain timeout), removed
  from it, stopped;
- changed (a flag, a file; `up` only): restarted one at a time with the new command line,
  drained first;
- the proxy's launch script is rewritten with the new instance list (it takes effect at its
  next start; its routing changes at once through /instances).

The record lists, at every step, what runs with the command line it runs with: `status`,
`restart` and `down` stay exact whatever step fails."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ucmctl.core.errors import ExitStatus, Problem, UcmctlError
from ucmctl.deploy import kv_probe
from ucmctl.deploy.preflight import Preflight, preflight
from ucmctl.deploy.proxy_client import Drain, Proxies
from ucmctl.deploy.restart import proxy_of, reach, restart_one
from ucmctl.deploy.staging import stage_node
from ucmctl.deploy.starting import failed_to_start, start_gated
from ucmctl.deploy.state import Record, StateStore
from ucmctl.launch import Launcher, launcher_for
from ucmctl.nodes.executor import NodeError
from ucmctl.nodes.fanout import parallel
from ucmctl.plan.model import Plan, Process


@dataclass
class Diff:
    added: list[Process] = field(default_factory=list)
    removed: list[Process] = field(default_factory=list)
    changed: list[tuple[Process, Process]] = field(default_factory=list)  # servers: (now, then)
    restaged: list[tuple[Process, Process]] = field(default_factory=list)  # the proxy: (now, then)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.restaged)


@dataclass(frozen=True)
class Changed:
    added: list[str]
    removed: list[str]
    restarted: list[str]
    cut: int  # requests still in flight at the drain timeout of a server taken out or restarted


def diff(old: Plan, new: Plan, *, restart_changed: bool, how: str) -> Diff:
    """What bringing `old` to `new` does; what it cannot do is refused (exit 2). `how` names
    the change in the refusals ("this scale", "this topology")."""
    again = f"use `ucmctl down {old.deployment}` and `up`"
    if (old.mode, old.engine) != (new.mode, new.engine):
        raise UcmctlError.one(
            f"{how} changes the deployment's mode or engine ({old.mode} {old.engine} -> {new.mode} "
            f"{new.engine}): not a change of a running deployment",
            fix=again,
        )
    proxies = [[(p.name, p.node, p.url) for p in plan.processes if p.role == "proxy"] for plan in (old, new)]
    if proxies[0] != proxies[1]:
        raise UcmctlError.one(
            f"{how} changes the proxy's replicas, nodes or port: not a change of a running deployment",
            fix=again,
        )
    before = {p.name: p for p in old.processes}
    after = {p.name: p for p in new.processes}
    d = Diff(
        added=[p for n, p in after.items() if n not in before],
        removed=[p for n, p in before.items() if n not in after],
    )
    for name in [n for n in after if n in before]:  # in plan order: the first named in a refusal
        was, now = before[name], after[name]
        if was == now:
            continue
        if was.role == "proxy" and (was.node, was.url, was.ports) == (now.node, now.url, now.ports):
            d.restaged.append((was, now))
        elif was.is_server and restart_changed and was.role == now.role:
            d.changed.append((was, now))
        else:
            raise UcmctlError.one(
                f"{how} would change {name} (its command line, devices, node or files), not only "
                "add or take out instances",
                fix=again,
            )
    d.changed = _in_port_order(d.changed, how)
    routed = any(p.role == "proxy" for p in new.processes)
    for was, now in d.changed:
        if routed and sum(1 for p in new.processes if p.role == now.role) == 1:
            raise UcmctlError.one(
                f"{how} changes {was.name}, the only {was.role} instance: requests would fail while "
                "it restarts",
                fix=f"add a second {was.role} instance first (`ucmctl scale`), or {again[4:]}",
            )
    if old.mode == "p2p" and (d.added or d.removed or d.changed):
        raise UcmctlError.one(
            f"{how}: a p2p deployment is not changed while it runs yet: each Mooncake config names "
            "its peers' layout",
            fix=again,
        )
    return d


def _in_port_order(changed: list[tuple[Process, Process]], how: str) -> list[tuple[Process, Process]]:
    """The changed servers in the order they can restart one at a time: one that takes a port
    another changed server holds on that node now goes after it (plan order otherwise). Servers
    that take each other's ports (a swap) cannot: refused, with the way out."""
    holder = {(was.node, port): was.name for was, _ in changed for port in was.ports.values()}
    takes = {  # name -> {port it takes: the other changed server holding it now}
        now.name: {
            port: n
            for port in now.ports.values()
            if (n := holder.get((now.node, port), now.name)) != now.name
        }
        for _, now in changed
    }
    left, ordered = list(changed), []
    while left:
        waiting = {now.name for _, now in left}
        ready = next(((w, n) for w, n in left if not waiting & set(takes[n.name].values())), None)
        if ready is None:  # every one left waits: walk the waits to a cycle
            seen: list[str] = []
            name = left[0][1].name
            while name not in seen:
                seen.append(name)
                name = next(b for b in takes[name].values() if b in waiting)
            cycle = seen[seen.index(name) :]
            a, b = cycle[-1], name  # a takes a port b holds
            port = next(port for port, holds in takes[a].items() if holds == b)
            node = next(n.node for _, n in left if n.name == a)
            around = (
                f"{b} takes a port of {a}"
                if len(cycle) == 2
                else "they wait in a ring: " + " -> ".join([*cycle, b])
            )
            raise UcmctlError.one(
                f"{how} gives {a} port {port} on node {node}, which {b} holds, and {around}; changed "
                "servers restart one at a time",
                fix="change it in two steps: move one of them to a free port first, `up`, then the rest",
            )
        left.remove(ready)
        ordered.append(ready)
    return ordered


def apply(
    record: Record,
    store: StateStore,
    new: Plan,
    d: Diff,
    *,
    drain: Drain,
    grace: float,
    tell: Callable[[str], None],
    check: bool = True,
    probe: bool = True,
    connect_timeout: float = 10.0,
) -> Changed:
    """Bring the running deployment of `record` to `new` (the caller holds its lock)."""
    runs = _Runs(record, store, new)
    proxy = proxy_of(record)
    both = new.model_copy(update={"nodes": {**record.plan.nodes, **new.nodes}})  # a dropped node's too
    launcher = launcher_for(both, record.allocation, connect_timeout=connect_timeout)
    try:
        reach(launcher, [*d.removed, *(was for was, _ in d.changed), *d.added])
        cleanup: dict[str, list[str]] = {}
        moved = [m for was, now in d.changed if (m := _moved(record.plan, was, now)) is not None]
        if check and (d.added or moved):
            checked = _check_new(new, d.added, moved, launcher)
            cleanup = checked.cleanup
            record.node_facts.update(checked.facts)  # the added nodes' provenance (and fresher)
        # first what is added (all or nothing), so what is taken out next has somewhere to go
        _bring_in(launcher, runs, d.added, proxy, cleanup, grace, tell, probe=probe)
        outcomes = parallel(d.removed, lambda p: _take_out(launcher, proxy, p, drain, grace, tell))
        for p, (_, error) in zip(d.removed, outcomes, strict=True):
            if error is None:
                runs.gone(p)
        failed = [error for _, error in outcomes if error is not None]
        if failed:
            raise UcmctlError.one(
                failed[0],
                status=ExitStatus.FAILURE,
                fix="it is out of routing; check the node, then run it again",
            )
        cut = sum(c for c, _ in outcomes)
        restarted = []
        for was, now in d.changed:
            runs.now(now)
            done = restart_one(launcher, record, store, was, proxy, drain, grace, tell, new=now)
            cut += done.cut
            restarted.append(was.name)
        for was, now in d.restaged:
            _restage(launcher, was, now)
            runs.now(now)
        kept = set(record.plan.nodes)
        record.node_facts = {n: f for n, f in record.node_facts.items() if n in kept}
        store.save(record)
    finally:
        launcher.close()
    return Changed([p.name for p in d.added], [p.name for p in d.removed], restarted, cut)


class _Runs:
    """What runs, as the record's plan (saved at every change): the plan before while every
    process runs as it did (a change undone), else the new plan's fields and each process's
    command line as it runs now."""

    def __init__(self, record: Record, store: StateStore, new: Plan) -> None:
        self.record, self.store, self.new, self.old = record, store, new, record.plan
        self.current = {p.name: p for p in record.plan.processes}

    def _save(self) -> None:
        if self.current == {p.name: p for p in self.old.processes}:
            self.record.plan = self.old
            self.store.save(self.record)
            return
        order = {p.name: i for i, p in enumerate(self.new.processes)}
        processes = sorted(self.current.values(), key=lambda p: order.get(p.name, len(order)))
        nodes = {**self.old.nodes, **self.new.nodes}  # a dropped node's while its processes run
        used = {p.node for p in processes} | set(self.new.nodes)
        self.record.plan = self.new.model_copy(
            update={"processes": processes, "nodes": {n: nodes[n] for n in nodes if n in used}}
        )
        self.store.save(self.record)

    def now(self, *processes: Process) -> None:
        for p in processes:
            self.current[p.name] = p
        self._save()

    def gone(self, *processes: Process) -> None:
        for p in processes:
            self.current.pop(p.name, None)
            self.record.processes.pop(p.name, None)
        self._save()


def _moved(running: Plan, was: Process, now: Process) -> Process | None:
    """What of a changed server is new to its node, for the preflight: all of it on another
    node, but of its ports only those no process of the deployment holds there now (a port it
    or a sibling holds is the deployment's own: the plan gives each port of a node once, and the
    sibling moves off it first); None when nothing is new."""
    held = {port for p in running.processes if p.node == now.node for port in p.ports.values()}
    new_ports = {k: v for k, v in now.ports.items() if v not in held}
    if now.node == was.node and not new_ports:
        return None
    return now.model_copy(update={"ports": new_ports})


def _check_new(new: Plan, added: list[Process], moved: list[Process], launcher: Launcher) -> Preflight:
    """`up`'s preflight on the nodes of what is added or moved, for that alone (its ports free,
    its devices there, the node's Python, engine and connector): exit 3, nothing changed."""
    processes = [*added, *moved]
    nodes = sorted({p.node for p in processes})
    part = new.model_copy(update={"processes": processes, "nodes": {n: new.nodes[n] for n in nodes}})
    checked = preflight(part, {n: launcher[n] for n in nodes}, restarting=frozenset(p.name for p in moved))
    staged = set() if checked.problems else {p.node for p in added}  # their staging cleans up
    for node, commands in checked.cleanup.items():
        if node not in staged:
            with contextlib.suppress(NodeError):
                launcher[node].run("; ".join(commands))
    if checked.problems:
        raise UcmctlError([Problem(p) for p in checked.problems], status=ExitStatus.NOT_READY)
    return checked


def _take_out(
    launcher: Launcher,
    proxy: Proxies | None,
    p: Process,
    drain: Drain,
    grace: float,
    tell: Callable[[str], None],
) -> tuple[int, str | None]:
    """(requests cut at the drain timeout, why it could not be stopped or None)."""
    t0 = time.monotonic()
    cut = 0
    if proxy is not None and p.is_server:
        cut = proxy.drain(p, drain)
        proxy.remove(p)
    try:
        launcher.stop(p, grace=grace)
    except NodeError as exc:
        return cut, f"could not stop {p.name} on {p.node}: {exc.reason}"
    tell(
        f"{p.name} on {p.node}: taken out in {time.monotonic() - t0:.1f} s"
        + (f" ({cut} request(s) still in flight at --drain-timeout: cut)" if cut else "")
    )
    return cut, None


def _bring_in(
    launcher: Launcher,
    runs: _Runs,
    added: list[Process],
    proxy: Proxies | None,
    cleanup: dict[str, list[str]],
    grace: float,
    tell: Callable[[str], None],
    *,
    probe: bool,
) -> None:
    """Start what is added; routed only once every one of them is healthy (and read the store)."""
    if not added:
        return
    record, t0 = runs.record, time.monotonic()
    for node in sorted({p.node for p in added}):
        running = stage_node(launcher[node], [p for p in added if p.node == node], cleanup.get(node))
        if running:
            raise UcmctlError.one(
                f"{', '.join(running)} already run(s) on {node}; nothing was changed",
                status=ExitStatus.NOT_READY,
                fix=f"`ucmctl down {record.deployment}`",
            )
    runs.now(*added)  # before anything starts: `down` must find it
    staying = [p for p in runs.current.values() if p not in added]

    def start(p: Process) -> str | None:
        reason = start_gated(launcher, record, runs.store, p)
        if reason is not None:
            return failed_to_start(launcher, p, reason)
        if probe:
            why = _probe(runs.new, p, staying, tell)
            if why is not None:
                return f"{p.name} on node {p.node}: KV probe: {why}"
        tell(f"{p.name} on {p.node}: healthy in {time.monotonic() - t0:.1f} s")
        return None

    failed = [reason for reason in parallel(added, start) if reason is not None]
    if failed:
        for p in added:
            with contextlib.suppress(NodeError):
                launcher.stop(p, grace=grace)
        runs.gone(*added)
        raise UcmctlError.one(
            f"{failed[0]}; the instances this change added are stopped again",
            status=ExitStatus.FAILURE,
            fix=f"see the log lines above; `ucmctl status {record.deployment}` shows what runs",
        )
    if proxy is not None:
        for p in added:
            if p.is_server:
                proxy.add(p)
                tell(f"{p.name} on {p.node}: added in {time.monotonic() - t0:.1f} s")


def _probe(plan: Plan, p: Process, staying: list[Process], tell: Callable[[str], None]) -> str | None:
    """A new prefill or decode instance of a centralized deployment with the store on decode:
    it reads what an instance that stays stored (or the other way round). Why not, or None."""
    if kv_probe.applies(plan) is not None or p.role not in ("prefill", "decode"):
        return None
    other = "decode" if p.role == "prefill" else "prefill"
    peer = next((s for s in staying if s.role == other), None)
    if peer is None:
        tell(f"{p.name}: KV probe skipped: no {other} instance that stays to pair it with")
        return None
    prefill, decode = (p, peer) if p.role == "prefill" else (peer, p)
    result = kv_probe.probe_pair(plan, prefill, decode)
    tell(f"{p.name}: KV probe: {result.detail}")
    return None if result.ok else result.detail


def _restage(launcher: Launcher, was: Process, now: Process) -> None:
    """Rewrite the files of a process that keeps running (the proxy's launch script lists the
    instances): what it runs with at its next start."""
    kept = {f.path: f.content for f in was.files}
    for f in now.files:
        if kept.get(f.path) != f.content:
            launcher[now.node].put(f.path, f.content, f.mode)
