"""The Plan: everything that will run, where, and how, computed without touching a machine."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlacedFile(Frozen):
    path: str  # absolute on the node
    content: str
    mode: int = 0o644


class Process(Frozen):
    name: str  # unique in the plan: mooncake-master, prefill-0, decode-3, proxy
    role: str  # mooncake | prefill | decode | mixed | proxy
    node: str
    stage: int  # start order: 0 mooncake, 1 servers, 2 proxy
    argv: list[str]
    env: dict[str, str]
    launch: str  # the script that runs argv with env (one of files)
    files: list[PlacedFile]
    ports: dict[str, int]
    url: str | None = None  # base URL of its HTTP API, as the control machine reaches it
    health: list[str] = Field(default_factory=list)  # URLs that must answer 200, in order
    log: str
    pidfile: str
    depends_on: list[str] = Field(default_factory=list)
    devices: list[int] = Field(default_factory=list)
    device_variable: str | None = None
    dp_rank: int | None = None


class NodePlan(Frozen):
    name: str
    host: str
    transport: str
    user: str
    ssh_port: int
    key: str | None
    platform: str
    devices: int
    python: str
    run_dir: str


class Plan(Frozen):
    schema_version: int = 1
    deployment: str  # the topology's name: one deployment per name per control machine
    mode: str
    engine: str
    topology_digest: str
    nodes: dict[str, NodePlan]
    processes: list[Process]

    def process(self, name: str) -> Process:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    def on_node(self, node: str) -> list[Process]:
        return [p for p in self.processes if p.node == node]

    def stages(self) -> list[list[Process]]:
        """Processes grouped by start order (start stage by stage, stop in reverse)."""
        by_stage: dict[int, list[Process]] = {}
        for p in self.processes:
            by_stage.setdefault(p.stage, []).append(p)
        return [by_stage[s] for s in sorted(by_stage)]
