"""The topology a user writes, as strict pydantic models (unknown keys are errors).

A topology names its nodes, then one or two *sides*: `prefill` and `decode` for PD
disaggregation, or `mixed` for one instance that does both phases. A side runs
`servers_per_node` vLLM API servers on each of its nodes. With `dp: 1` each server is an
independent instance; with `dp > 1` and `dp_mode: external` (the EP layout) each server is one
DP rank with its own API server, ranks numbered node by node; with `dp_mode: internal` one
server runs all `dp` ranks itself (the PD-mixed layout).
"""

from __future__ import annotations

import hashlib
import json
import re
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_validator

from ucmctl.core.names import NAME_RE, SERVER_ROLES, ServerRole
from ucmctl.core.platforms import Platform
from ucmctl.core.ucm_config import DEFAULT_DUMP_TIMEOUT_S, DEFAULT_LOAD_TIMEOUT_S
from ucmctl.engines import DEFAULT_ENGINE, ENGINES
from ucmctl.topology.container import Container, Env
from ucmctl.topology.fields import Port, Restart, Strict, bind_address
from ucmctl.topology.proxy import Proxy

# Used with fullmatch: `$` alone would also match before a trailing newline.
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FLAG_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")
HOST_RE = re.compile(r"[A-Za-z0-9_.:-]{1,253}")


def _host_text(v: str) -> str:
    """A hostname or an IP address: it lands in argv and URLs, so no shell or URL syntax."""
    if not HOST_RE.fullmatch(v) or v.startswith("-"):
        raise ValueError("must be a hostname or an IP address")
    return v


class Mode(str, Enum):
    centralized = "centralized"  # P writes KV to the shared store, D reads it as a prefix hit
    p2p = "p2p"  # Mooncake moves KV P->D; UCM gives P a prefix cache
    mixed = "mixed"  # one vLLM serves both phases, with UCM


# The engines' registry, as an enum (vllm; sim, ucmctl's simulator: same command line, no
# accelerator needed). mypy cannot list the members of an enum made from a variable.
Engine = Enum("Engine", [(name, name) for name in ENGINES], type=str)  # type: ignore[misc]


class Transport(str, Enum):
    ssh = "ssh"
    local = "local"


class DpMode(str, Enum):
    external = "external"  # one API server per DP rank (external load balancing)
    internal = "internal"  # one API server runs every DP rank


PositiveCount = Annotated[int, Field(ge=1, le=64)]
FlagValue = str | int | float | bool | dict[str, Any] | list[Any]


class Node(Strict):
    """One machine."""

    host: str = Field(
        "",
        description="address the control machine and the other nodes reach it at (required, but "
        "on Slurm with `choose_nodes`: then Slurm's address of the node it gives)",
    )
    transport: Transport = Field(Transport.ssh, description="`local` runs on this machine without SSH")
    user: str = Field("root", pattern=r"^[a-z_][a-z0-9_.-]{0,31}$", description="SSH user")
    port: Port = Field(22, description="SSH port")
    key: str | None = Field(None, description="SSH private key file (default: ~/.ssh/config and agent)")
    platform: Platform = Platform.cuda
    devices: int = Field(8, ge=0, le=64, description="accelerator cards on the node")
    nic: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.:-]{1,15}$", description="NIC for collective traffic"
    )
    python: str = Field("python3", description="Python that has vLLM and ucmctl installed")
    venv: str | None = Field(None, description="virtual environment; overrides `python`")
    workdir: str | None = Field(None, description="where run directories go (default /tmp/ucmctl-<user>)")
    env: Env = Field(default_factory=dict, description="environment for every process")
    container: Container = Field(
        default_factory=lambda: Container.model_validate({}),
        description="where the node's processes run: bare (its Python), or an image under podman or docker",
    )
    bind: str | None = Field(
        None,
        description="IP address the node's servers, proxy and Mooncake master listen on (default: host; "
        "127.0.0.1 on a local node); 0.0.0.0 listens on every interface",
    )
    systemd: bool = Field(
        False,
        description="systemd is the node's init: a bare process with `restart: on-failure` runs as a "
        "transient systemd unit (systemd-run) that restarts it, not under ucmctl's supervisor",
    )

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        return _host_text(v) if v else v  # "": not given (checks.py says where it is needed)

    @field_validator("bind")
    @classmethod
    def _bind(cls, v: str | None) -> str | None:
        return None if v is None else bind_address(v)


# Slurm's time formats (sbatch --time): minutes, minutes:seconds, hours:minutes:seconds,
# days-hours, days-hours:minutes, days-hours:minutes:seconds; or no limit.
SLURM_TIME_RE = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|(?i:unlimited|infinite)")
SLURM_NAME_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"


class SshCluster(Strict):
    """The nodes are reached over SSH (or run on this machine): ucmctl places every process."""

    kind: Literal["ssh"] = "ssh"


class SlurmCluster(Strict):
    """Slurm places the deployment: one allocation holds its nodes, each process is a job step.
    Node names are Slurm node names; each node's `host` is the address its servers answer on;
    `workdir` must be a filesystem this machine and every node share."""

    kind: Literal["slurm"]
    partition: str | None = Field(None, pattern=SLURM_NAME_RE, description="sbatch --partition")
    account: str | None = Field(None, pattern=SLURM_NAME_RE, description="sbatch --account")
    qos: str | None = Field(None, pattern=SLURM_NAME_RE, description="sbatch --qos")
    time_limit: str | None = Field(
        None, description="sbatch --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED"
    )
    wait_allocation: float = Field(
        300, gt=0, description="seconds `up` waits for the allocation to start (then gives up)"
    )
    gres: str | None = Field(
        None,
        pattern=r"^[a-z][a-z0-9_]*(:[A-Za-z0-9_.-]+)?$",
        description="the accelerators as Slurm GRES (`gpu`, `gpu:a100`): the allocation asks for as many "
        "per node as the plan uses, every step gets them, and each process's device indices count "
        "within the ones Slurm gave the job",
    )
    choose_nodes: bool = Field(
        False,
        description="let Slurm choose the nodes: the topology's node names are only names, bound in "
        "name order to the nodes of the allocation, and their addresses come from Slurm (no `host`)",
    )

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)  # YAML reads `time_limit: 30` as a number: Slurm reads it as minutes
        if isinstance(v, str) and not SLURM_TIME_RE.fullmatch(v):
            raise ValueError(
                "is not a Slurm time limit: use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED"
            )
        return v


Cluster = Annotated[SshCluster | SlurmCluster, Field(discriminator="kind")]


class Model(Strict):
    path: str = Field(description="model directory (or hub id) passed to `vllm serve`")
    served_name: str | None = Field(None, description="--served-model-name")
    dtype: str = Field("auto", pattern=r"^[a-z0-9_]+$", description="--dtype of every instance")
    hash_seed: int = Field(0, ge=0, le=4294967295, description="PYTHONHASHSEED, identical on every instance")


class Storage(Strict):
    """The UCM store (the guides' `ucm_connector_config`)."""

    store_pipeline: str = Field("Cache|Posix", description="tiers: Cache|Posix or Posix")
    storage_backends: list[str] = Field(
        min_length=1, description="shared directories, the same filesystem on every node"
    )
    # allow_inf_nan=False: the connector reads numbers, and YAML has no portable infinity.
    cache_buffer_capacity_gb: float = Field(
        64, ge=0, allow_inf_nan=False, description="DRAM tier per instance, GiB"
    )
    posix_capacity_gb: float = Field(0, ge=0, allow_inf_nan=False, description="0 = unlimited")
    io_direct: bool = Field(False, description="O_DIRECT file I/O")
    use_layerwise: bool = Field(False, description="load and save layer by layer")
    enable_event_sync: bool = Field(True, description="order device copies with events, not syncs")
    load_timeout_s: float = Field(
        DEFAULT_LOAD_TIMEOUT_S,
        gt=0,
        lt=86400,
        allow_inf_nan=False,
        description="a KV load not done by then (+1 s per 0.1 GB it loads) is given up and recomputed; "
        "no block back for half of it is a stalled mount: given up then",
    )
    dump_timeout_s: float = Field(
        DEFAULT_DUMP_TIMEOUT_S,
        gt=0,
        lt=86400,
        allow_inf_nan=False,
        description="a KV dump not stored (prefill: persisted) by then is given up and counted",
    )
    pack_blocks: int = Field(
        1,
        ge=1,
        le=4096,
        strict=True,
        description="blocks of a prompt per file on shared storage (packs): a network filesystem pays "
        "its per-file round trips once per pack; 1 = a file per block; aim for 16-64 MiB per pack",
    )

    @field_validator("load_timeout_s", "dump_timeout_s", mode="before")
    @classmethod
    def _seconds(cls, v: Any, info: Any) -> Any:
        default = cls.model_fields[info.field_name].default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 86400:
            raise ValueError(
                f"must be a number of seconds > 0 and < 86400; leave it out for the "
                f"default ({default:g} s) or set the longest a step may wait for the storage"
            )
        return v

    @field_validator("storage_backends", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return v.split(":") if isinstance(v, str) else v

    def ucm_store_values(self) -> dict[str, Any]:
        """The store's part of the UCM config file (`ucm_connector_config`), before validation
        against its schema (ucmctl.core.ucm_config.StoreConfig)."""
        values: dict[str, Any] = {
            "store_pipeline": self.store_pipeline,
            "storage_backends": list(self.storage_backends),
            "cache_buffer_capacity_gb": self.cache_buffer_capacity_gb,
        }
        if self.posix_capacity_gb:
            values["posix_capacity_gb"] = self.posix_capacity_gb
        if self.io_direct:
            values["io_direct"] = True
        return values


class Mooncake(Strict):
    master_node: str = Field(description="node that runs mooncake_master")
    connector: Literal["MooncakeConnector", "MooncakeConnectorV1"] | None = Field(
        None,
        description="P2P connector: MooncakeConnector (vLLM's; default on cuda and cpu) or "
        "MooncakeConnectorV1 (vllm-ascend's; default on ascend)",
    )
    port: Port = Field(50088, description="master RPC port")
    metrics_port: Port = Field(9003, description="master metrics port (the health gate)")
    protocol: Literal["ascend", "rdma", "tcp"] | None = Field(
        None,
        description="transfer protocol (default: ascend with MooncakeConnectorV1, rdma on cuda, tcp on cpu)",
    )
    device_name: str = Field("", description="device_name (RDMA NIC), when the protocol needs one")
    num_workers: int | None = Field(
        None, ge=1, le=256, description="MooncakeConnector sender threads (vLLM's default: 10)"
    )
    global_segment_size: str = Field("1GB", pattern=r"^[0-9]+(\.[0-9]+)?\s*[KMGT]?B$")
    eviction_high_watermark_ratio: float = Field(0.9, gt=0, le=1)
    eviction_ratio: float = Field(0.1, gt=0, le=1)
    default_kv_lease_ttl: int = Field(11000, ge=1, description="ms")


class PeerParallel(Strict):
    """The other side's parallelism as written into a Mooncake connector config."""

    dp: int = Field(ge=1, description="the other side's data-parallel size")
    tp: int = Field(ge=1, description="the other side's tensor-parallel size")


class Side(Strict):
    """One role (prefill, decode or mixed): where its servers run and how."""

    nodes: list[str] = Field(min_length=1, description="node names, in rank order")
    servers_per_node: PositiveCount | dict[str, PositiveCount] = Field(
        1, description="API servers on each node, or a count per node name"
    )
    dp: int = Field(1, ge=1, le=1024, description="data-parallel size of one engine group")
    tp: int = Field(1, ge=1, le=64, description="tensor-parallel size")
    dp_mode: DpMode = Field(
        DpMode.external, description="external: one API server per DP rank; internal: one"
    )
    port: Port = Field(8000, description="port of a node's first API server; the next add 1 each")
    dp_rpc_port: Port = Field(13395, description="--data-parallel-rpc-port (external DP)")
    kv_port: Port = Field(20001, description="Mooncake kv_port of a node's first server (+ i*tp)")
    bootstrap_port: Port = Field(
        8998, description="MooncakeConnector bootstrap port of a node's first prefill server (+ i)"
    )
    kv_events_port: Port | None = Field(
        None,
        description="port of a node's first server's KV-cache event publisher (+ i), where the proxy reads "
        "the events (proxy.kv_events); default: each server's API port + 1000. The engine adds its DP rank",
    )
    kv_peer: PeerParallel | None = Field(
        None, description="the other side's dp/tp in the Mooncake config (default: derived)"
    )
    expert_parallel: bool = Field(False, description="--enable-expert-parallel")
    dtype: str | None = Field(None, pattern=r"^[a-z0-9_]+$", description="overrides model.dtype")
    flags: dict[str, FlagValue | None] = Field(default_factory=dict, description="extra vLLM flags")
    env: Env = Field(default_factory=dict)
    container: Container | None = Field(
        None, description="where the side's servers run (default: their node's `container`)"
    )
    restart: Restart = Field(
        default_factory=Restart,
        description="never, or on-failure: a server that fails is started again (its runtime's "
        "--restart in a container, a systemd unit on a `systemd: true` node, else ucmctl's supervisor)",
    )

    @field_validator("restart", mode="before")
    @classmethod
    def _restart(cls, v: Any) -> Any:
        return Restart.parse(v)

    def placement(self) -> list[tuple[str, int]]:
        """(node, number of API servers) in rank order."""
        if isinstance(self.servers_per_node, int):
            return [(n, self.servers_per_node) for n in self.nodes]
        return [(n, self.servers_per_node.get(n, 0)) for n in self.nodes]

    def server_count(self) -> int:
        return sum(count for _, count in self.placement())


class Topology(Strict):
    name: str = Field(description="deployment name, unique per control machine")
    mode: Mode = Field(
        description="centralized (KV through the store), p2p (Mooncake P->D), mixed (one instance)"
    )
    engine: Engine = Field(
        Engine(DEFAULT_ENGINE), description="vllm, or sim: ucmctl's simulator, same command line"
    )
    model: Model = Field(description="what every instance serves")
    nodes: dict[str, Node] = Field(min_length=1, description="every machine, by name")
    cluster: Cluster = Field(
        default_factory=SshCluster, description="who places the processes: ssh (default) or slurm"
    )
    storage: Storage | None = Field(None, description="UCM store; omit to run without UCM")
    mooncake: Mooncake | None = Field(None, description="the Mooncake master (p2p mode only)")
    proxy: Proxy | None = Field(None, description="the proxy clients talk to (needed for PD modes)")
    prefill: Side | None = Field(None, description="prefill instances (centralized, p2p)")
    decode: Side | None = Field(None, description="decode instances (centralized, p2p)")
    mixed: Side | None = Field(None, description="instances that do both phases (mixed)")
    # Digest of the topology as written: set by the loader before it resolves relative paths,
    # so the same file gives the same digest in every checkout.
    _written_digest: str | None = PrivateAttr(None)

    def digest(self) -> str:
        if self._written_digest:
            return self._written_digest
        from ucmctl.topology.digest_compat import without_newer

        # The fields newer than the records, at their defaults, leave the digest as it was.
        data = without_newer("topology", self.model_dump(mode="json"))
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(NAME_RE, v):
            raise ValueError(
                "use 1-63 lowercase letters, digits, '-', '_' or '.', starting with a letter or digit"
            )
        return v

    def container_of(self, node: str, side: ServerRole | None = None) -> Container:
        """Where a process on `node` runs: its side's container for a server, else its node's."""
        chosen = getattr(self, side).container if side is not None else None
        return chosen if chosen is not None else self.nodes[node].container

    def sides(self) -> list[tuple[ServerRole, Side]]:
        """The sides present, in start order."""
        out = [(name, getattr(self, name)) for name in SERVER_ROLES]
        return [(n, s) for n, s in out if s is not None]
