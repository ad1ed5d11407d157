"""Launchers: who places the Plan's processes on their nodes, and how they are found again.

`up`'s stages, the health gates, the records, `down`, `status`, `logs` and `bench` talk to a
`Launcher` and never ask which one runs: `NodeLauncher` reaches the nodes itself (SSH, or this
machine), `SlurmLauncher` takes one allocation and runs each process as a job step. The registry
below is keyed by the Plan's cluster kind (`Plan.cluster.kind`, as the topology's `cluster.kind`):
a new launcher is one module and one line here."""

from __future__ import annotations

from collections.abc import Callable

from ucmctl.launch.base import Allocation, Launcher, LaunchError, LaunchOptions
from ucmctl.plan.model import Plan


def _nodes(plan: Plan, allocation: Allocation | None, options: LaunchOptions) -> Launcher:
    from ucmctl.launch.nodes import NodeLauncher

    return NodeLauncher(plan, allocation, options)


def _slurm(plan: Plan, allocation: Allocation | None, options: LaunchOptions) -> Launcher:
    from ucmctl.launch.slurm import SlurmLauncher  # imported when used: Slurm's parsing is not small

    return SlurmLauncher(plan, allocation, options)


LAUNCHERS: dict[str, Callable[[Plan, Allocation | None, LaunchOptions], Launcher]] = {
    "ssh": _nodes,
    "slurm": _slurm,
}


def launcher_for(
    plan: Plan,
    allocation: Allocation | None = None,
    *,
    connect_timeout: float = 10.0,
    accept_new_host_keys: bool = False,
) -> Launcher:
    """The launcher of `plan`; `allocation` is what a record kept of an earlier `up`."""
    options = LaunchOptions(connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys)
    return LAUNCHERS[plan.cluster.kind](plan, allocation, options)


__all__ = ["LAUNCHERS", "Allocation", "LaunchError", "LaunchOptions", "Launcher", "launcher_for"]
