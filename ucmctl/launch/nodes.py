"""The default launcher: ucmctl reaches each node itself, over SSH or on this machine."""

from __future__ import annotations

from ucmctl.deploy.executor import Executor, executor_for
from ucmctl.launch.base import Launcher
from ucmctl.plan.model import Plan


class NodeLauncher(Launcher):
    kind = "ssh"

    def __init__(
        self, plan: Plan, *, connect_timeout: float = 10.0, accept_new_host_keys: bool = False
    ) -> None:
        super().__init__(plan)
        self.connect_timeout = connect_timeout
        self.accept_new_host_keys = accept_new_host_keys

    def _open(self, node: str) -> Executor:
        return executor_for(
            self.plan.nodes[node],
            connect_timeout=self.connect_timeout,
            accept_new_host_keys=self.accept_new_host_keys,
        )
