"""The default launcher: ucmctl reaches each node itself, over SSH or on this machine."""

from __future__ import annotations

import posixpath

from ucmctl.launch.base import Launcher
from ucmctl.nodes import lifecycle
from ucmctl.nodes.executor import Executor, executor_for


class NodeLauncher(Launcher):
    kind = "ssh"

    def _open(self, node: str) -> Executor:
        return executor_for(
            self.plan.nodes[node],
            connect_timeout=self.options.connect_timeout,
            accept_new_host_keys=self.options.accept_new_host_keys,
        )

    def sweep(self, *, grace: float = 10) -> list[tuple[str, str]]:
        """The containers' sweep, then the bare processes of the deployment on its nodes that
        its plan does not name (found by their folder's pidfile and marker: a scaled-in
        instance whose record was lost), stopped."""
        left = super().sweep(grace=grace)
        known = {p.name for p in self.plan.processes}
        bare = [p for p in self.plan.processes if p.container is None]
        launches = {posixpath.basename(p.launch) for p in bare}  # launch.sh, supervise.sh
        templates = {p.node: p for p in bare}
        for node, template in sorted(templates.items()):
            for stray in lifecycle.strays(self[node], template, known, launches):
                lifecycle.stop(self[node], stray, grace=grace)
                left.append((node, stray.name))
        return left
