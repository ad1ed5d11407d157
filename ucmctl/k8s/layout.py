"""How one side's API servers become a LeaderWorkerSet: its instances (replicas), the pods of an
instance (size) and the containers of a pod, and where each of the Plan's servers lands."""

from __future__ import annotations

from dataclasses import dataclass

from ucmctl.core.errors import UcmctlError
from ucmctl.engines import ServerSpec
from ucmctl.plan.model import Plan, Process


@dataclass(frozen=True)
class SideLayout:
    """How one side's API servers become a LeaderWorkerSet."""

    role: str
    name: str  # the LWS (and its headless Service)
    replicas: int  # instances
    size: int  # pods per instance
    templates: list[Process]  # the Plan's servers of the first pod, one per container
    external_dp: bool
    # every Plan server -> (group, worker index, container index)
    where: dict[str, tuple[int, int, int]]

    @property
    def per_pod(self) -> int:
        return len(self.templates)

    def pod_host(self, namespace: str, group: int, worker: int) -> str:
        """The pod's DNS name under the LWS's headless Service (LWS_LEADER_ADDRESS's form)."""
        pod = f"{self.name}-{group}" if worker == 0 else f"{self.name}-{group}-{worker}"
        return f"{pod}.{self.name}.{namespace}"


def side_layout(plan: Plan, base: str, role: str, procs: list[Process]) -> SideLayout:
    """The LeaderWorkerSet of one side's servers `procs` (the Plan's, in rank order); `base`
    is the deployment's name as a DNS label."""
    platforms = {plan.nodes[p.node].platform for p in procs}
    if len(platforms) > 1:
        raise UcmctlError.one(
            f"{role}: nodes of several platforms ({', '.join(sorted(platforms))}) cannot share one "
            "pod template",
            key=f"{role}.nodes",
            fix="give each side nodes of one platform",
        )
    name = f"{base}-{role}"
    spec = server_spec(procs[0])
    if not spec.external_dp:
        where = {p.name: (i, 0, 0) for i, p in enumerate(procs)}
        return SideLayout(role, name, len(procs), 1, [procs[0]], False, where)
    dp = spec.data_parallel_size
    groups = [procs[i : i + dp] for i in range(0, len(procs), dp)]
    runs = [_runs(group) for group in groups]
    per_pod = runs[0][0]
    if len(procs) % dp or any(count != per_pod for run in runs for count in run):
        raise UcmctlError.one(
            f"{role}: a LeaderWorkerSet needs the same number of DP ranks on every node of a DP "
            f"group (the layout gives {[run for run in runs]})",
            key=f"{role}.servers_per_node",
            fix=f"use one servers_per_node that divides dp ({dp})",
        )
    where = {}
    for g, group in enumerate(groups):
        for rank, p in enumerate(group):
            where[p.name] = (g, rank // per_pod, rank % per_pod)
    return SideLayout(role, name, len(groups), dp // per_pod, groups[0][:per_pod], True, where)


def _runs(group: list[Process]) -> list[int]:
    """How many consecutive ranks of a DP group each node holds."""
    runs: list[tuple[str, int]] = []
    for p in group:
        if runs and runs[-1][0] == p.node:
            runs[-1] = (p.node, runs[-1][1] + 1)
        else:
            runs.append((p.node, 1))
    return [count for _, count in runs]


def server_spec(p: Process) -> ServerSpec:
    assert p.server is not None, f"{p.name} is an API server of the Plan: it has a server spec"
    return p.server
