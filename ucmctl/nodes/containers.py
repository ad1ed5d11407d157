"""Process lifecycle through a container runtime (podman or docker) on a node.

A contained process is its container: its launch script starts it detached (`run --detach
--init`) and returns; whether it runs, how it ended and how often it restarted are the runtime's
answers (`inspect`); its output is the runtime's log; stopping is `stop` with a grace period,
then `rm`. Containers are found by name and checked by label, so a container that is not this
deployment's is never touched; `sweep` finds every container of a deployment by its label, also
when the local record is lost.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from ucmctl.nodes.executor import Executor, NodeError, Watch
from ucmctl.nodes.lifecycle import Started, Stopped
from ucmctl.nodes.run_state import RunState
from ucmctl.plan.containers import LABEL_DEPLOYMENT, LABEL_PROCESS
from ucmctl.plan.model import ContainerPlan, Process

_FORMAT = (
    '{"state": "{{.State.Status}}", "exit": {{.State.ExitCode}}, "pid": {{.State.Pid}}, '
    '"restarts": {{.RestartCount}}, "deployment": "{{index .Config.Labels "' + LABEL_DEPLOYMENT + '"}}", '
    '"process": "{{index .Config.Labels "' + LABEL_PROCESS + '"}}"}'
)


@dataclass(frozen=True)
class ContainerState:
    process: str
    state: str  # the runtime's: created, running, exited, paused, ...
    exit_code: int
    pid: int
    restarts: int

    @property
    def running(self) -> bool:
        return self.state == "running"

    def run_state(self) -> RunState:
        """The process's state: running, exited with its code, or another of the runtime's
        states; with its restarts by the runtime's policy."""
        if self.running:
            return RunState.up(self.restarts)
        # podman says `stopped` for a container whose main process ended until its cleanup ran
        if self.state in ("exited", "stopped"):
            return RunState.exited(self.exit_code, self.restarts)
        return RunState.other(self.state, self.restarts)


def _container(process: Process) -> ContainerPlan:
    assert process.container is not None, f"{process.name} runs bare"
    return process.container


def _rt(c: ContainerPlan) -> str:
    return shlex.quote(c.runtime)


def state(ex: Executor, process: Process) -> ContainerState | None:
    """The process's container as the runtime sees it; None when there is none of this deployment."""
    c = _container(process)
    done = ex.run(
        f"{_rt(c)} inspect --type container --format {shlex.quote(_FORMAT)} "
        f"{shlex.quote(c.name)} 2>/dev/null || true",
        timeout=30,
    )
    for line in done.stdout.splitlines():
        found = _parse(line)
        if found is not None and found[0] == c.labels[LABEL_DEPLOYMENT]:
            return found[1]
    return None


def _parse(line: str) -> tuple[str, ContainerState] | None:
    try:
        d = json.loads(line)
        return d["deployment"], ContainerState(
            d["process"], str(d["state"]), int(d["exit"]), int(d["pid"]), int(d["restarts"])
        )
    except (ValueError, KeyError, TypeError):
        return None


def start(ex: Executor, process: Process, *, wait: float = 120) -> Started:
    """Run the launch script (it starts the container detached); the container's main pid."""
    c = _container(process)
    done = ex.run(f"sh {shlex.quote(process.launch)}", timeout=wait)
    if not done.ok:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
        raise NodeError(ex.node.name, f"could not start {process.name} ({c.runtime} run): {' '.join(said)}")
    now = state(ex, process)
    return Started(now.pid if now is not None else 0)


def alive(ex: Executor, process: Process) -> int | None:
    now = state(ex, process)
    return now.pid if now is not None and now.running else None


def watch(ex: Executor, process: Process) -> Watch:
    """A loop on the node that lasts while the container runs, a byte a second."""
    c = _container(process)
    fmt = shlex.quote("{{.State.Status}}")
    return ex.watch(
        f'while [ "$({_rt(c)} inspect --type container --format {fmt} {shlex.quote(c.name)} '
        '2>/dev/null)" = running ]; do echo . || exit 0; sleep 1; done'
    )


def stop(ex: Executor, process: Process, *, grace: float = 10) -> Stopped:
    """`stop` (TERM through the init process, KILL after `grace`), then remove the container."""
    c = _container(process)
    before = state(ex, process)
    if before is None:
        return Stopped(was_running=False, killed=False)
    name = shlex.quote(c.name)
    if before.running:
        done = ex.run(f"{_rt(c)} stop --time {max(1, round(grace))} {name} >/dev/null", timeout=grace + 60)
        if not done.ok:
            raise NodeError(ex.node.name, f"could not stop {process.name}: {done.stderr.strip()}")
    after = state(ex, process)
    done = ex.run(f"{_rt(c)} rm --force {name} >/dev/null", timeout=60)
    if not done.ok:
        raise NodeError(ex.node.name, f"could not remove container {c.name}: {done.stderr.strip()}")
    killed = before.running and after is not None and after.exit_code == 137
    return Stopped(was_running=before.running, killed=killed)


def signal(ex: Executor, process: Process, sig: str) -> bool:
    """`sig` (KILL, TERM, STOP or CONT) to the container's main process from the node, as a
    crash, an outside stop or a hang would come (`podman kill` would count as the user stopping
    it, and docker then skips its restart policy); whether it ran."""
    if sig not in ("KILL", "TERM", "STOP", "CONT"):
        raise ValueError(f"signal {sig!r} is not KILL, TERM, STOP or CONT")
    now = state(ex, process)
    if now is None or not now.running or now.pid <= 1:
        return False
    done = ex.run(f"kill -{sig} {int(now.pid)}", timeout=30)
    if not done.ok:
        raise NodeError(ex.node.name, f"could not signal {process.name}: {done.stderr.strip()}")
    return True


def log_tail(ex: Executor, process: Process, lines: int = 50) -> str:
    c = _container(process)
    done = ex.run(f"{_rt(c)} logs --tail {int(lines)} {shlex.quote(c.name)} 2>&1", timeout=30)
    return done.stdout if done.ok else ""


def sweep(ex: Executor, runtime: str, deployment: str, *, grace: float = 10) -> list[str]:
    """Stop and remove every container labelled with `deployment` on the node (the ones a lost
    record or another plan of it left); the processes they were."""
    rt = shlex.quote(runtime)
    label = shlex.quote(f"label={LABEL_DEPLOYMENT}={deployment}")
    fmt = shlex.quote('{{.Id}} {{index .Config.Labels "' + LABEL_PROCESS + '"}}')
    done = ex.run(
        f"command -v {rt} >/dev/null || exit 0; ids=$({rt} ps --all --quiet --filter {label}); "
        f'[ -z "$ids" ] || {rt} inspect --type container --format {fmt} $ids',
        timeout=30,
    )
    found = [line.split(maxsplit=1) for line in done.stdout.splitlines() if line.strip()]
    if not found:
        return []
    ids = " ".join(shlex.quote(f[0]) for f in found)
    done = ex.run(
        f"{rt} stop --time {max(1, round(grace))} {ids} >/dev/null 2>&1; {rt} rm --force {ids} >/dev/null",
        timeout=grace + 60,
    )
    if not done.ok:
        raise NodeError(
            ex.node.name, f"could not remove the containers of {deployment}: {done.stderr.strip()}"
        )
    return [f[1] if len(f) > 1 else f[0] for f in found]
