"""The default launcher: ucmctl reaches each node itself, over SSH or on this machine."""

from __future__ import annotations

from ucmctl.launch.base import Launcher
from ucmctl.nodes.executor import Executor, executor_for


class NodeLauncher(Launcher):
    kind = "ssh"

    def _open(self, node: str) -> Executor:
        return executor_for(
            self.plan.nodes[node],
            connect_timeout=self.options.connect_timeout,
            accept_new_host_keys=self.options.accept_new_host_keys,
        )
