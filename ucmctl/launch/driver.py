"""The driver of a process: what starts, looks at and stops it on its node, chosen once per
process (`driver_of`): a process group of its own (`Bare`, nodes/lifecycle.py), or a container its
runtime runs detached (`Contained`, nodes/containers.py). Each operation takes the executor of
the process's node."""

from __future__ import annotations

from ucmctl.nodes import containers, lifecycle
from ucmctl.nodes.executor import Executor, Watch
from ucmctl.nodes.run_state import Kind, RunState
from ucmctl.plan.model import Process


class Driver:
    """The operations on one kind of process."""

    def start(self, ex: Executor, process: Process) -> lifecycle.Started:
        raise NotImplementedError

    def alive(self, ex: Executor, process: Process) -> int | None:
        """Its process-group id (or its container's main pid) while it runs, else None."""
        raise NotImplementedError

    def watch(self, ex: Executor, process: Process) -> Watch:
        raise NotImplementedError

    def stop(self, ex: Executor, process: Process, *, grace: float) -> lifecycle.Stopped:
        raise NotImplementedError

    def signal(self, ex: Executor, process: Process, sig: str) -> bool:
        raise NotImplementedError

    def log_tail(self, ex: Executor, process: Process, lines: int) -> str:
        raise NotImplementedError

    def run_state(self, ex: Executor, process: Process) -> RunState:
        """How the process is now, from what its node answers."""
        raise NotImplementedError


class Bare(Driver):
    """A process group of its own on the node, maybe restarted by ucmctl's supervisor or systemd."""

    def start(self, ex: Executor, process: Process) -> lifecycle.Started:
        return lifecycle.start(ex, process)

    def alive(self, ex: Executor, process: Process) -> int | None:
        return lifecycle.alive(ex, process)

    def watch(self, ex: Executor, process: Process) -> Watch:
        return lifecycle.watch(ex, process)

    def stop(self, ex: Executor, process: Process, *, grace: float) -> lifecycle.Stopped:
        return lifecycle.stop(ex, process, grace=grace)

    def signal(self, ex: Executor, process: Process, sig: str) -> bool:
        """A supervised process's server gets it, not ucmctl's supervisor (which may restart it)."""
        spare = process.restart is not None and process.restart.by == "supervisor"
        return lifecycle.signal(ex, process, sig, spare_leader=spare)

    def log_tail(self, ex: Executor, process: Process, lines: int) -> str:
        return lifecycle.log_tail(ex, process, lines)

    def run_state(self, ex: Executor, process: Process) -> RunState:
        """Running or not; what restarts it says how it ended (without one, that is not known)."""
        running = self.alive(ex, process) is not None
        restart = process.restart
        if restart is not None and restart.by in ("supervisor", "systemd"):
            told = lifecycle.supervised(ex, process)
            if told is not None:
                return told.run_state(running, restart.max_restarts)
        return RunState.up() if running else RunState(Kind.not_running)


class Contained(Driver):
    """A container its runtime runs detached: the runtime says how it ended and how often it
    restarted."""

    def start(self, ex: Executor, process: Process) -> lifecycle.Started:
        return containers.start(ex, process)

    def alive(self, ex: Executor, process: Process) -> int | None:
        return containers.alive(ex, process)

    def watch(self, ex: Executor, process: Process) -> Watch:
        return containers.watch(ex, process)

    def stop(self, ex: Executor, process: Process, *, grace: float) -> lifecycle.Stopped:
        return containers.stop(ex, process, grace=grace)

    def signal(self, ex: Executor, process: Process, sig: str) -> bool:
        return containers.signal(ex, process, sig)

    def log_tail(self, ex: Executor, process: Process, lines: int) -> str:
        return containers.log_tail(ex, process, lines)

    def run_state(self, ex: Executor, process: Process) -> RunState:
        container = containers.state(ex, process)
        return RunState(Kind.no_container) if container is None else container.run_state()


BARE, CONTAINED = Bare(), Contained()


def driver_of(process: Process) -> Driver:
    """The driver of `process`: its container's runtime when it runs detached, else its own group."""
    return CONTAINED if process.detached else BARE
