"""Launchers: who places the Plan's processes on their nodes, and how they are found again.

`up`'s stages, the health gates, the records, `down`, `status`, `logs` and `bench` talk to a
`Launcher` and never ask which one runs: `NodeLauncher` reaches the nodes itself (SSH, or this
machine), `SlurmLauncher` takes one allocation and runs each process as a job step."""

from __future__ import annotations

from ucmctl.launch.base import Allocation, Launcher, LaunchError
from ucmctl.plan.model import Plan


def launcher_for(
    plan: Plan,
    allocation: Allocation | None = None,
    *,
    connect_timeout: float = 10.0,
    accept_new_host_keys: bool = False,
) -> Launcher:
    """The launcher of `plan`; `allocation` is what a record kept of an earlier `up`."""
    if plan.slurm is not None:
        from ucmctl.launch.slurm import SlurmLauncher

        return SlurmLauncher(plan, allocation)
    from ucmctl.launch.nodes import NodeLauncher

    return NodeLauncher(plan, connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys)


__all__ = ["Allocation", "LaunchError", "Launcher", "launcher_for"]
