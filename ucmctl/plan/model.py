"""The Plan: everything that will run, where, and how, computed without touching a machine.

Everything after planning (deploy, preflight, purge, status, bench) reads the Plan, never the
topology: what a process is (its `role`), when it starts (`stage`), how long it may take to
become healthy, what its node binds, and what the UCM store is, are all written here. It
imports only ucmctl.core, ucmctl.engines and the proxy's spec (plan/proxy_spec.py).
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ucmctl.core.names import NAME_RE, SERVER_ROLES, Role
from ucmctl.engines import ENGINES, ServerSpec, engine_for
from ucmctl.plan.proxy_spec import ProxySpec

# 2: Process.health_timeout, NodePlan.bind, Plan.store. 3: Plan.cluster (a union with a `kind`)
# replaces Plan.slurm; Process.server. deploy/state.py upgrades records of 1 and 2.
PLAN_SCHEMA_VERSION = 3

# The engines' registry, as a Literal of its names (to mypy, any str: it cannot read a Literal
# made from a variable).
if TYPE_CHECKING:
    EngineName = str
else:
    EngineName = Literal[tuple(ENGINES)]
ModeName = Literal["centralized", "p2p", "mixed"]

# The UCM config file each store user reads, in its work directory.
UCM_CONFIG_FILE = "ucm_config.yaml"


class Stage(IntEnum):
    """Start order: stage by stage, each gated on the previous one's health; stop in reverse."""

    mooncake = 0
    servers = 1
    proxy = 2


# How long the Mooncake master and the proxy may take to become healthy; a server, its engine's.
HEALTH_TIMEOUT: dict[str, float] = {"mooncake": 60.0, "proxy": 60.0}


def default_health_timeout(role: str, engine: str) -> float:
    """Seconds a process of `role` may take to answer its health checks, served by `engine`."""
    return HEALTH_TIMEOUT[role] if role in HEALTH_TIMEOUT else engine_for(engine).health_timeout


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlacedFile(Frozen):
    path: str  # absolute on the node
    content: str
    mode: int = 0o644


class ContainerPlan(Frozen):
    """A process that runs in a container: the runtime's whole command line that starts it, and
    what finds it again (its name and labels; `down` also finds it by the deployment's label)."""

    runtime: Literal["podman", "docker", "pyxis", "oci"]
    image: str  # what runs: the derived image or bundle of `base_image` (ucmctl image build), or base_image
    base_image: str  # the topology's image (oci: the OCI bundle's folder)
    derived: bool
    python: str  # the image's Python
    name: str
    labels: dict[str, str]
    pull: Literal["never", "missing", "always"]
    devices: list[str]  # device nodes of the node the container maps (preflight checks they exist)
    # podman/docker: `podman run --detach ... IMAGE COMMAND...` (the process's argv inside);
    # pyxis, oci: the options its job step's srun adds (the step runs the launch script in the image).
    argv: list[str]
    # oci: the bind mounts (HOST:CONTAINER[:ro]) of the bundle `ucmctl image build` makes for it
    mounts: list[str] = Field(default_factory=list)

    @property
    def detached(self) -> bool:
        """Started by a runtime on the node and found through it (pyxis steps are process groups)."""
        return self.runtime in ("podman", "docker")


class RestartPlan(Frozen):
    """A process started again when it fails (the topology's `restart: on-failure`), and by what."""

    # supervisor: ucmctl's, on the node (supervise.sh); systemd: a transient unit (nodes/units.py)
    by: Literal["supervisor", "systemd", "podman", "docker"]
    max_restarts: int
    backoff_s: float | None  # None: the runtime's own delay
    state: str | None = None  # supervisor: the file it writes each end of the process to
    script: str | None = None  # systemd: what its unit runs (unit.sh, beside the launch script)

    def words(self) -> str:
        """How `ucmctl plan` says it."""
        if self.by == "supervisor":
            return (
                f"on-failure, at most {self.max_restarts}x, {self.backoff_s:g} s apart, by "
                "ucmctl's supervisor on the node"
            )
        if self.by == "systemd":
            return (
                f"on-failure, at most {self.max_restarts}x, {self.backoff_s:g} s apart, by "
                "systemd (a transient unit)"
            )
        return (
            f"on-failure, at most {self.max_restarts}x, by {self.by} --restart=on-failure:{self.max_restarts}"
        )


def process_marker(name: str, launch: str) -> str:
    """The variable in the environment of every process a plan's process runs (its launch
    script's path in it), by which ucmctl finds them; never matched by a process's name."""
    return f"UCMCTL_PROCESS={name}@{launch}"


class Process(Frozen):
    name: str  # unique in the plan: mooncake-master, prefill-0, decode-3, proxy
    role: Role
    node: str
    stage: Stage
    argv: list[str]
    env: dict[str, str]
    launch: str  # the script that runs argv with env (one of files)
    files: list[PlacedFile]
    ports: dict[str, int]
    url: str | None = None  # base URL of its HTTP API, as the control machine reaches it
    health: list[str] = Field(default_factory=list)  # URLs that must answer 200, in order
    health_timeout: float  # seconds for `health` to answer once started
    log: str
    pidfile: str
    depends_on: list[str] = Field(default_factory=list)
    devices: list[int] = Field(default_factory=list)
    device_variable: str | None = None
    dp_rank: int | None = None
    server: ServerSpec | None = None  # an API server's structured spec: argv is its engine's argv of it
    proxy: ProxySpec | None = None  # the proxy's structured spec: argv is its argv()
    container: ContainerPlan | None = None  # None: runs on the node's own Python (launch runs argv)
    restart: RestartPlan | None = None  # None: never restarted

    @property
    def is_server(self) -> bool:
        return self.role in SERVER_ROLES

    @property
    def detached(self) -> bool:
        """Runs as a container the node's runtime started (nodes/containers.py), not a process group."""
        return self.container is not None and self.container.detached


class NodePlan(Frozen):
    name: str
    host: str
    transport: Literal["ssh", "local", "slurm"]  # slurm: reached through job steps (launch/slurm.py)
    user: str
    ssh_port: int
    key: str | None
    platform: str
    devices: int
    python: str
    run_dir: str
    bind: str  # the address every listener on the node binds (0.0.0.0: every interface)
    slurm_node: str | None = None  # the Slurm node it was bound to, when Slurm chose it
    systemd: bool = False  # systemd is its init: restarts by transient units (preflight proves it)


class StorePlan(Frozen):
    """The UCM store of the deployment: what `purge` deletes and preflight checks."""

    pipeline: str  # tiers joined by "|": Cache|Posix, Posix, Cache
    backends: list[str]  # shared directories, the same filesystem on every node
    cache_buffer_capacity_gb: float  # DRAM tier per user process, GiB (when the pipeline has Cache)
    io_direct: bool = False  # the store opens its files O_DIRECT: preflight proves the filesystem takes it
    pack_blocks: int = 1  # blocks of one prompt per file (storage.pack_blocks); 1: a file per block
    users: list[str]  # the processes that load the UCM connector, each with its UCM_CONFIG_FILE

    @property
    def tiers(self) -> list[str]:
        return self.pipeline.split("|")


class SshClusterPlan(Frozen):
    """ucmctl reaches every node itself: over SSH, or on this machine."""

    kind: Literal["ssh"] = "ssh"


class SlurmPlan(Frozen):
    """The deployment's one Slurm allocation: what `up` asks sbatch for."""

    kind: Literal["slurm"] = "slurm"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = None
    wait_allocation: float = 300.0  # seconds `up` waits for the allocation to start
    choose_nodes: bool = False  # Slurm chooses the nodes; the plan's names are bound in name order
    gres: str | None = None  # the accelerators as Slurm GRES ("gpu"): asked per node, given to each step

    def gres_per_node(self, plan: Plan) -> str | None:
        """`--gres` for the allocation and its steps: as many per node as the plan's processes
        use on the busiest node (device indices count from 0 within the job's)."""
        if self.gres is None:
            return None
        used = max((max(p.devices) + 1 for p in plan.processes if p.devices), default=0)
        return f"{self.gres}:{used}" if used else None

    def job_name(self, deployment: str) -> str:
        """The allocation's job name: how `down` finds it when the local record is lost."""
        return f"ucmctl-{deployment}"


# Who places the processes: the launcher registry (launch/__init__.py) is keyed by `kind`.
ClusterPlan = Annotated[SshClusterPlan | SlurmPlan, Field(discriminator="kind")]


class Plan(Frozen):
    schema_version: int = PLAN_SCHEMA_VERSION
    deployment: str = Field(pattern=NAME_RE)  # one deployment per name per control machine
    mode: ModeName
    engine: EngineName
    topology_digest: str
    nodes: dict[str, NodePlan]
    processes: list[Process]
    store: StorePlan | None = None
    cluster: ClusterPlan = Field(default_factory=SshClusterPlan)

    def process(self, name: str) -> Process:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    def on_node(self, node: str) -> list[Process]:
        return [p for p in self.processes if p.node == node]

    def servers(self) -> list[Process]:
        return [p for p in self.processes if p.is_server]

    def proxy_urls(self) -> list[str]:
        """Where clients send requests: the proxy, or each of its replicas."""
        return [p.url for p in self.processes if p.role == "proxy" and p.url]

    def proxy_words(self) -> str:
        """`proxy URL`, or `proxies URL, URL`; "" without a proxy."""
        urls = self.proxy_urls()
        return f"prox{'ies' if len(urls) > 1 else 'y'} {', '.join(urls)}" if urls else ""

    def uses_store(self, process: Process) -> bool:
        return self.store is not None and process.name in self.store.users

    def store_nodes(self) -> list[str]:
        """The nodes of the store's users, sorted."""
        return sorted({p.node for p in self.processes if self.uses_store(p)})

    def stages(self) -> list[list[Process]]:
        """Processes grouped by start order (start stage by stage, stop in reverse)."""
        by_stage: dict[int, list[Process]] = {}
        for p in self.processes:
            by_stage.setdefault(p.stage, []).append(p)
        return [by_stage[s] for s in sorted(by_stage)]
