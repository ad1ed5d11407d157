"""`ucmctl restart`: processes of a running deployment stopped and started again without losing
a request: each server is drained at the proxy first (no new request goes there, those in
flight finish up to the drain timeout), stopped, started, gated on its health, and routed to
again. `--rolling` does one at a time; the record stays exact (pid, start time, restarts)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from ucmctl.core.errors import ExitStatus, UcmctlError
from ucmctl.deploy.proxy_client import Drain, Proxies
from ucmctl.deploy.staging import stage_node
from ucmctl.deploy.starting import ports_taken, start_gated
from ucmctl.deploy.state import Record, StateStore, Status
from ucmctl.launch import Launcher, launcher_for
from ucmctl.nodes.executor import NodeError
from ucmctl.nodes.fanout import parallel
from ucmctl.plan.model import Process


@dataclass(frozen=True)
class Restarted:
    process: str
    node: str
    drained_s: float  # waited for its requests in flight
    cut: int  # requests still in flight at the drain timeout (cut by the stop)
    took_s: float  # from the drain to back in routing


def running_record(store: StateStore, deployment: str) -> Record:
    """The record of a deployment that is up (exit 2 otherwise); its lock held by the caller."""
    record = store.load(deployment)
    if record is None:
        raise UcmctlError.one(
            f"no deployment named '{deployment}' on this machine", fix="see `ucmctl status`"
        )
    if record.status is not Status.up:
        raise UcmctlError.one(
            f"deployment '{deployment}' is {record.status}, not up", fix="`ucmctl up` it first"
        )
    return record


def proxy_of(record: Record) -> Proxies | None:
    """The deployment's proxy (every replica of it), if it has one."""
    urls = record.plan.proxy_urls()
    return Proxies(urls) if urls else None


def reach(launcher: Launcher, processes: list[Process]) -> None:
    """Every process's node answers (a Slurm job still runs them) before anything is changed:
    exit 3 otherwise, nothing touched."""
    for p in processes:
        try:
            launcher.alive(p)
        except NodeError as exc:
            raise UcmctlError.one(
                f"{p.name}: node {p.node}: {exc.reason}; nothing was changed",
                status=ExitStatus.NOT_READY,
                fix="see `ucmctl status`",
            ) from None


def chosen(record: Record, names: list[str]) -> list[Process]:
    """The processes named (every API server when none is), checked: exit 2 on a name the
    deployment does not have."""
    plan = record.plan
    if not names:
        return [p for p in plan.processes if p.is_server]
    known = {p.name: p for p in plan.processes}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UcmctlError.one(
            f"deployment '{record.deployment}' has no process '{unknown[0]}'",
            fix=f"name one of {', '.join(known)}",
        )
    return [known[n] for n in dict.fromkeys(names)]


def restart(
    deployment: str,
    names: list[str],
    *,
    rolling: bool,
    drain: Drain,
    grace: float,
    force: bool = False,
    console: Console | None = None,
    store: StateStore | None = None,
    say: Callable[[str], None] | None = None,
) -> list[Restarted]:
    """Restart the named processes of a running deployment (one at a time with `rolling`)."""
    console = console or Console(stderr=True, emoji=False)
    store = store or StateStore()
    tell = say or (lambda line: console.print(escape(line), soft_wrap=True))
    with store.lock(deployment, "restart"):
        record = running_record(store, deployment)
        targets = chosen(record, names)
        proxy = proxy_of(record)
        batches = [[p] for p in targets] if rolling else [targets]
        launcher = launcher_for(record.plan, record.allocation, connect_timeout=10)
        done: list[Restarted] = []
        try:
            reach(launcher, targets)
            if proxy is not None and not force:
                alive = parallel(targets, launcher.alive)
                _refuse_an_outage(
                    proxy, batches, {p.name for p, pid in zip(targets, alive, strict=True) if pid is None}
                )
            for batch in batches:

                def one(p: Process) -> Restarted:
                    return restart_one(launcher, record, store, p, proxy, drain, grace, tell)

                done += parallel(batch, one)
        finally:
            launcher.close()
    return done


def _refuse_an_outage(proxy: Proxies, batches: list[list[Process]], down: set[str]) -> None:
    """A batch that would drain every routed instance of a role: requests would fail meanwhile.
    Those of it that are `down` (not running) take nothing out: restarting only them is no outage."""
    for batch in batches:
        for role in sorted({p.role for p in batch if p.is_server}):
            ours = [p for p in batch if p.role == role]
            serving = [p for p in ours if p.name not in down]
            if serving and proxy.routed(role, {str(p.url) for p in ours}) == 0:
                what = ", ".join(p.name for p in serving)
                raise UcmctlError.one(
                    f"restarting {what} leaves no {role} instance in routing: requests would fail meanwhile",
                    fix="use --rolling with more than one instance, or --force to accept the outage",
                )


ROUTED_WITHIN_S = 15.0  # how long a restart waits for the proxy to route to the server again
PORTS_SETTLE_S = 5.0  # how long a stopped server's ports may take to be let go (its exit)


def restart_one(
    launcher: Launcher,
    record: Record,
    store: StateStore,
    p: Process,
    proxy: Proxies | None,
    drain: Drain,
    grace: float,
    tell: Callable[[str], None],
    new: Process | None = None,
) -> Restarted:
    """Drain `p` at the proxy, stop it, start it (as `new` when given: its files staged first),
    gate it on its health, route to it again. Exit 1 when it does not come back: it stays out
    of routing."""
    t0 = time.monotonic()
    routed = proxy is not None and p.is_server
    cut = 0
    if routed:
        assert proxy is not None
        cut = proxy.drain(p, drain)
    drained = time.monotonic() - t0
    if cut:
        tell(f"{p.name}: {cut} request(s) still in flight after --drain-timeout {drain.timeout:g} s: cut")
    then = new or p
    try:
        launcher.stop(p, grace=grace)
        if new is not None and stage_node(launcher[new.node], [new]):
            raise NodeError(new.node, "it still runs after the stop")
        if taken := ports_taken(launcher, then, settle_s=PORTS_SETTLE_S):
            raise NodeError(
                then.node,
                f"port {', '.join(map(str, taken))} in use by another process once {p.name} stopped: "
                "not started again",
            )
    except NodeError as exc:
        raise UcmctlError.one(
            f"{p.name} on node {p.node}: {exc.reason}",
            status=ExitStatus.FAILURE,
            fix="see `ucmctl status` and `ucmctl logs`",
        ) from None
    reason = start_gated(launcher, record, store, then, again=True)
    if reason is not None:
        tail = launcher.log_tail(then, 20)
        raise UcmctlError.one(
            f"{p.name} on node {then.node} did not come back: {reason}"
            + (f"; its last log lines:\n{tail}" if tail else ""),
            status=ExitStatus.FAILURE,
            fix="see `ucmctl logs`; it stays out of routing" if routed else None,
        )
    if routed:
        assert proxy is not None
        if then.url == p.url:
            proxy.resume(p)
        else:
            proxy.remove(p)
            proxy.add(then)
    # routed again only once the proxy's own health loop has seen it answer (seconds)
    unrouted = routed and proxy is not None and not proxy.wait_routed(then, ROUTED_WITHIN_S)
    took = time.monotonic() - t0
    tell(
        f"{p.name} on {then.node}: restarted in {took:.1f} s (drained in {drained:.1f} s)"
        + (f"; the proxy does not route to it yet after {ROUTED_WITHIN_S:g} s" if unrouted else "")
    )
    return Restarted(p.name, then.node, drained, cut, took)
