"""The launcher interface, and what every launcher does the same way.

A launcher gives an `Executor` per node (commands and files there: preflight, staging, the
node locks, logs) and starts processes. Once started, a process is the same thing under every
launcher: a process group on its node, its pid in its pidfile, its marker in its environment
(nodes/lifecycle.py), so looking at it and stopping it go through the node's executor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict
from rich.console import Console

from ucmctl.core.errors import ExitStatus, Problem, UcmctlError
from ucmctl.launch.driver import Driver, driver_of
from ucmctl.nodes import containers, lifecycle
from ucmctl.nodes.executor import Executor, Watch
from ucmctl.nodes.run_state import RunState
from ucmctl.plan.model import Plan, Process
from ucmctl.topology.model import Topology


class LaunchError(UcmctlError):
    """The launcher's scheduler refused or failed; the message carries its own words."""

    def __init__(self, message: str, status: ExitStatus = ExitStatus.FAILURE) -> None:
        super().__init__([Problem(message)], status)


@dataclass(frozen=True)
class LaunchOptions:
    """How `up` and the other commands asked for the nodes to be reached."""

    connect_timeout: float = 10.0  # seconds to reach a node (SSH)
    accept_new_host_keys: bool = False  # record SSH host keys not yet known (a changed one is refused)


class Allocation(BaseModel):
    """What the scheduler gave a deployment, kept in its record (no secrets: a job id)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["slurm"]
    job_name: str
    job_id: str | None = None  # None: submitted, no id read back yet (`down` finds it by name)
    nodes: dict[str, str] = {}  # node name -> the Slurm node it was bound to (choose_nodes)


class Launcher:
    """Start, look at and stop the Plan's processes. Subclasses give `executor` and may take
    and give back what the processes run in (`acquire`, `release`)."""

    kind = "nodes"

    def __init__(
        self, plan: Plan, allocation: Allocation | None = None, options: LaunchOptions | None = None
    ) -> None:
        self.plan = plan
        self.options = options or LaunchOptions()
        self._executors: dict[str, Executor] = {}

    # -- nodes -------------------------------------------------------------------------------

    def _open(self, node: str) -> Executor:
        raise NotImplementedError

    def executor(self, node: str) -> Executor:
        """Commands and files on `node`, opened on first use and closed by `close`."""
        if node not in self._executors:
            self._executors[node] = self._open(node)
        return self._executors[node]

    def __getitem__(self, node: str) -> Executor:
        return self.executor(node)

    def standalone(self, node: str) -> Executor:
        """Commands on `node` when the deployment is not running (purge, install)."""
        return self.executor(node)

    def all(self) -> dict[str, Executor]:
        """The executors of every node that runs a process of the plan."""
        return {name: self[name] for name in self.plan.nodes if self.plan.on_node(name)}

    def close(self) -> None:
        for ex in self._executors.values():
            ex.close()

    # -- what the processes run in -----------------------------------------------------------

    @property
    def allocation(self) -> Allocation | None:
        return None

    def preflight(self) -> list[str]:
        """Problems the launcher itself finds before anything is asked of the scheduler or the
        nodes (one line each); none for SSH."""
        return []

    def acquire(
        self, console: Console, on_submitted: Callable[[Allocation], None], *, wait: float | None = None
    ) -> None:
        """Take what the processes need before any node is asked (Slurm: the allocation);
        `on_submitted` is told what to record before the scheduler is asked, and again when it
        answered, so a `down` after a crash finds it; `wait` bounds how long it may take (seconds)."""

    def bind(self, topology: Topology) -> Plan | None:
        """The plan bound to what `acquire` got, when that decides where processes run (Slurm
        choosing the nodes); None when the plan stands as it is."""
        return None

    def release(self) -> bool:
        """Give it back once every process is stopped; whether nothing of it is left."""
        return True

    def view(self) -> list[str]:
        """The scheduler's view of the deployment for `status`, one line each (none for SSH)."""
        return []

    # -- processes ---------------------------------------------------------------------------

    def driver(self, process: Process) -> Driver:
        """What starts, looks at and stops `process` on its node (launch/driver.py)."""
        return driver_of(process)

    def start(self, process: Process) -> lifecycle.Started:
        return self.driver(process).start(self[process.node], process)

    def alive(self, process: Process) -> int | None:
        return self.driver(process).alive(self[process.node], process)

    def run_state(self, process: Process) -> RunState:
        """How the process is now, as its node answers (a NodeError when it does not)."""
        return self.driver(process).run_state(self[process.node], process)

    def watch(self, process: Process) -> Watch:
        return self.driver(process).watch(self[process.node], process)

    def stop(self, process: Process, *, grace: float) -> lifecycle.Stopped:
        return self.driver(process).stop(self[process.node], process, grace=grace)

    def signal(self, process: Process, sig: str) -> bool:
        """Send `sig` (KILL, TERM, STOP, CONT) to the process and return at once; whether it was running.
        A supervised process's server gets it, not ucmctl's supervisor (which may restart it)."""
        return self.driver(process).signal(self[process.node], process, sig)

    def sweep(self, *, grace: float = 10) -> list[tuple[str, str]]:
        """Stop and remove what is left of the deployment's containers on its nodes (found by
        label: another plan's or a lost record's); (node, process) of each."""
        runtimes = {(p.node, p.container.runtime) for p in self.plan.processes if p.container and p.detached}
        left: list[tuple[str, str]] = []
        for node, runtime in sorted(runtimes):
            for name in containers.sweep(self[node], runtime, self.plan.deployment, grace=grace):
                left.append((node, name))
        return left

    def log_tail(self, process: Process, lines: int = 50) -> str:
        return self.driver(process).log_tail(self[process.node], process, lines)
