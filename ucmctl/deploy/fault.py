"""A fault `bench --fault` injects: a signal to one process of a deployment, through the launcher
that started it (a process group on its node, a container, a Slurm step), over a connection
opened beforehand so the signal goes out when it is due."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ucmctl.core.errors import UcmctlError
from ucmctl.deploy.state import Record
from ucmctl.launch import launcher_for
from ucmctl.plan.model import Process

SIGNALS = {"kill": "KILL", "stop": "TERM", "hang": "STOP"}
RELEASES = {"hang": "CONT"}  # what lets the process go on after the fault, where it needs one


def process_named(record: Record, name: str, flag: str = "--fault") -> Process:
    """The deployment's process `name`, or a one-line error that lists them (exit 2)."""
    for p in record.plan.processes:
        if p.name == name:
            return p
    names = ", ".join(p.name for p in record.plan.processes)
    raise UcmctlError.one(
        f"deployment '{record.deployment}' has no process '{name}'", key=flag, fix=f"name one of {names}"
    )


Send = Callable[[], bool]


@contextmanager
def signaller(record: Record, process: Process, action: str) -> Iterator[tuple[Send, Send | None]]:
    """A function that sends `action`'s signal to `process` and returns whether it was running,
    and one that lets it go on afterwards (a hang's SIGCONT; None for the others); its node is
    reached now (a node that cannot be is an error before the benchmark starts)."""
    sig, release = SIGNALS[action], RELEASES.get(action)
    launcher = launcher_for(record.plan, record.allocation, connect_timeout=10)
    try:
        launcher.alive(process)  # opens the connection the signal will take
        yield (
            lambda: launcher.signal(process, sig),
            None if release is None else lambda: launcher.signal(process, release),
        )
    finally:
        launcher.close()
