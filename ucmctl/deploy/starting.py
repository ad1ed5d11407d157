"""Starting one process of a deployment: started, recorded (before the wait, so `down` always
finds it), gated on its health. What `up`, `restart`, `scale` and an `up` of a changed topology
share."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ucmctl.deploy.health import wait_healthy
from ucmctl.deploy.state import ProcessState, Record, StateStore
from ucmctl.launch import Launcher
from ucmctl.nodes.executor import NodeError
from ucmctl.plan.model import Process

# The TCP ports something listens on in the node's network namespace, one per line (none where
# `ss` is missing: the check is then the health gate's alone).
LISTENING = """ss -ltnH 2>/dev/null | awk '{n=split($4, a, ":"); print a[n]}' | sort -un"""


def start_gated(
    launcher: Launcher,
    record: Record,
    store: StateStore,
    process: Process,
    *,
    timeout: float | None = None,
    again: bool = False,
    on_started: Callable[[], None] = lambda: None,
    cancelled: Callable[[], bool] = lambda: False,
) -> str | None:
    """Start `process` and wait for its health: None once healthy, else why not in one line.

    `again`: a restart of a process the record already has (its restarts count goes up).
    The watch on the process's start tells at once when it ends; one direct look confirms it
    (a watch channel that closed is not a dead process)."""
    state = record.processes.get(process.name)
    if state is None or not again:
        state = record.processes[process.name] = ProcessState(name=process.name, node=process.node)
    try:
        started = launcher.start(process)
    except NodeError as exc:
        return exc.reason
    state.pgid, state.started_at = started.pgid, time.time()
    if again:
        state.restarts += 1
    store.save(record)
    on_started()
    watch = launcher.watch(process)
    try:
        return wait_healthy(
            process.health,
            timeout=process.health_timeout if timeout is None else timeout,
            still_alive=lambda: not watch.finished() or launcher.alive(process) is not None,
            alive_every=0.5,
            cancelled=cancelled,
        )
    finally:
        watch.close()


def failed_to_start(launcher: Launcher, process: Process, reason: str, lines: int = 20) -> str:
    """`decode-2 on node n1 did not come up: <why>; its last log lines:\n...`"""
    tail = launcher.log_tail(process, lines)
    return f"{process.name} on node {process.node} did not come up: {reason}" + (
        f"; its last log lines:\n{tail}" if tail else ""
    )


def ports_taken(launcher: Launcher, process: Process, settle_s: float = 0) -> list[int]:
    """Those of `process`'s ports that something listens on, on its node, after `settle_s`
    seconds at most (and up to one more: whole seconds) for them to be let go. Before a start
    that is not `up`'s (its preflight looked): a port taken meanwhile would fail the process's
    bind while whatever holds it answered its health checks in its place. The settle is for a
    process just stopped: the kernel closes its sockets only after tearing down its memory, and
    /proc stops showing it as the group's member (its environment) at the start of that (a CI
    run saw a simulator's port still listening right after its stop)."""
    ports = sorted(set(process.ports.values()))
    wanted = " ".join(str(int(p)) for p in ports)
    wait_s = math.ceil(settle_s) + 1 if settle_s > 0 else 0
    script = (
        f"end=$(($(date +%s) + {wait_s})); while :; do "
        f"l=$({LISTENING}); t=; for p in {wanted}; do "
        'printf "%s\\n" "$l" | grep -qx "$p" && t="$t $p"; done; '
        '[ -z "$t" ] || [ "$(date +%s)" -ge "$end" ] && break; sleep 0.1; done; echo "$t"'
    )
    done = launcher[process.node].run(script, timeout=settle_s + 30)
    return sorted(int(p) for p in done.stdout.split() if p.isdigit())
