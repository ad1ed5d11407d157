"""The local record of each deployment: enough for `down`, `status`, `logs` and `bench` to work
from a fresh shell. Nodes keep their own record too (the run directories), so `down TOPOLOGY`
works even when this one is lost."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from ucmctl.core.errors import ExitStatus, UcmctlError
from ucmctl.deploy.kv_probe import ProbeResult
from ucmctl.launch.base import Allocation
from ucmctl.plan.model import (
    NAME_RE,
    PLAN_SCHEMA_VERSION,
    SERVER_ROLES,
    UCM_CONFIG_FILE,
    Plan,
    default_health_timeout,
)

# 2: its plan is of schema 2. 3: of schema 3 (PLAN_SCHEMA_VERSION). Records of 1 and 2 are
# upgraded as they are read.
RECORD_SCHEMA_VERSION = 3


class Status(str, Enum):
    """Where a deployment stands, as its record says it (written as the word: records of any
    ucmctl read the same)."""

    starting = "starting"
    up = "up"
    failed = "failed"
    stopped = "stopped"

    def __str__(self) -> str:
        return self.value


class ProcessState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    node: str
    pgid: int | None = None  # process-group id on its node (None: never started)
    started_at: float | None = None
    restarts: int = 0


class Record(BaseModel):
    """One deployment as this control machine started it. No secrets: ports, pids, paths."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = RECORD_SCHEMA_VERSION
    deployment: str
    topology_path: str
    topology_digest: str
    created_at: float = Field(default_factory=time.time)
    status: Status = Status.starting
    plan: Plan
    processes: dict[str, ProcessState] = Field(default_factory=dict)
    kv_probe: ProbeResult | None = None  # the last proof that KV reached decode (deploy/kv_probe.py)
    allocation: Allocation | None = None  # what a scheduler gave the deployment (launch/slurm.py)
    # Per node, what preflight read there that a result's provenance names: engine, torch and
    # Python versions, device and CPU model, each container image's id (deploy/preflight.py).
    node_facts: dict[str, dict[str, str]] = Field(default_factory=dict)


@dataclass(frozen=True)
class Endpoints:
    proxies: list[str]  # the proxy, or each of its replicas
    instances: list[tuple[str, str, str]]  # (process name, role, base URL)


_SAVE_LOCK = threading.Lock()


def state_dir() -> Path:
    return Path(os.environ.get("UCMCTL_HOME") or Path.home() / ".ucmctl") / "deployments"


class StateStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or state_dir()

    def path(self, deployment: str) -> Path:
        import re

        if not re.fullmatch(NAME_RE, deployment):  # never build a path from an unchecked string
            raise UcmctlError.one(f"'{deployment}' is not a deployment name")
        return self.root / f"{deployment}.json"

    def save(self, record: Record) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.path(record.deployment)
        # Processes start in parallel threads, each saving the record as it learns a pgid.
        with _SAVE_LOCK:
            text = json.dumps(record.model_dump(mode="json"), indent=1)
            tmp = target.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(text)
            os.replace(tmp, target)  # a reader never sees half a record

    def load(self, deployment: str) -> Record | None:
        path = self.path(deployment)
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text())
            version = raw.get("schema_version") if isinstance(raw, dict) else None
            if version == 1:
                raw = upgrade_v1(raw)
                version = 2
            if version == 2:
                raw = upgrade_v2(raw)
            elif version != RECORD_SCHEMA_VERSION:
                raise UcmctlError.one(
                    f"deployment record of schema version {version!r}, this ucmctl reads "
                    f"{RECORD_SCHEMA_VERSION}: use the ucmctl that started it",
                    file=str(path),
                )
            return Record.model_validate(raw)
        except ValueError as exc:
            raise UcmctlError.one(
                f"unreadable deployment record: {exc}",
                file=str(path),
                fix="remove it after `ucmctl down TOPOLOGY`",
            ) from None

    @contextlib.contextmanager
    def lock(self, deployment: str, action: str) -> Iterator[None]:
        """Hold this deployment's lock for `action` ("up", "down"); a second holder is refused.

        The lock is an flock on `<name>.lock`, so the kernel drops it when its holder dies: a
        killed `up` leaves no stale lock to clean up. The pid, host and time written into the
        file are only for the message the loser prints."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(deployment).with_suffix(".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # never deleted: see _LOCK_NOTE
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UcmctlError.one(
                    f"deployment '{deployment}' is busy: {_holder(path)}",
                    fix="wait for it to finish or stop that command (Ctrl-C), then run this again",
                    status=ExitStatus.BUSY,
                ) from None
            os.ftruncate(fd, 0)
            owner = {"action": action, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
            os.pwrite(fd, json.dumps(owner).encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the flock

    def remove(self, deployment: str) -> None:
        self.path(deployment).unlink(missing_ok=True)

    def all(self) -> list[Record]:
        if not self.root.is_dir():
            return []
        records = [self.load(p.stem) for p in sorted(self.root.glob("*.json"))]
        return [r for r in records if r is not None]


# _LOCK_NOTE: the lock file stays. Deleting it on release would let a later `up` lock a new
# file while an earlier loser still holds the old, unlinked one open: two holders.


def _holder(path: Path) -> str:
    """Who holds a lock, as one line: `ucmctl up` (pid 123 on host, since 12:00:01)."""
    try:
        owner = json.loads(path.read_text() or "{}")
        since = time.strftime("%H:%M:%S", time.localtime(float(owner["since"])))
        pid, host = int(owner["pid"]), owner["host"]
        return f"`ucmctl {owner['action']}` (pid {pid} on {host}, since {since}) holds it"
    except (OSError, ValueError, KeyError, TypeError):
        return "another ucmctl command holds it"  # it is writing its name this instant


def endpoints(deployment: str, store: StateStore | None = None) -> Endpoints:
    """The proxy (its replicas) and every API server of a deployment that is up."""
    record = (store or StateStore()).load(deployment)
    if record is None:
        raise UcmctlError.one(
            f"no deployment named '{deployment}' on this machine", fix="see `ucmctl status`, or pass --url"
        )
    instances: list[tuple[str, str, str]] = [
        (p.name, p.role, p.url) for p in record.plan.processes if p.is_server and p.url
    ]
    return Endpoints(record.plan.proxy_urls(), instances)


def upgrade_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """A record of schema 1 (before the plan said each process's health timeout, each node's
    bind and the store) as schema 2, from what its plan already held: the timeouts by role and
    engine as they were decided then, the bind from the servers' `--host`, the store from the
    rendered UCM config files."""
    plan = dict(raw["plan"])
    processes = [dict(p) for p in plan["processes"]]
    for p in processes:
        p.setdefault("health_timeout", default_health_timeout(p["role"], plan["engine"]))
    nodes = {}
    for name, node in plan["nodes"].items():
        hosts = [
            p["argv"][p["argv"].index("--host") + 1]
            for p in processes
            if p["node"] == name and "--host" in p["argv"][:-1]
        ]
        default = "127.0.0.1" if node["transport"] == "local" else node["host"]
        nodes[name] = {"bind": hosts[0] if hosts else default, **node}
    plan.update(processes=processes, nodes=nodes, schema_version=2)
    plan.setdefault("store", _store_of_v1(processes))
    return {**raw, "plan": plan, "schema_version": 2}


def upgrade_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """A record of schema 2 as schema 3: the plan's `slurm` (None: SSH) is its `cluster`."""
    plan = dict(raw["plan"])
    slurm = plan.pop("slurm", None)
    plan.update(cluster=slurm if slurm is not None else {"kind": "ssh"}, schema_version=PLAN_SCHEMA_VERSION)
    return {**raw, "plan": plan, "schema_version": RECORD_SCHEMA_VERSION}


def _store_of_v1(processes: list[dict[str, Any]]) -> dict[str, Any] | None:
    users, store = [], None
    for p in processes:
        for f in p["files"]:
            if p["role"] in SERVER_ROLES and f["path"].endswith("/" + UCM_CONFIG_FILE):
                users.append(p["name"])
                store = yaml.safe_load(f["content"])["ucm_connectors"][0]["ucm_connector_config"]
    if store is None:
        return None
    backends = store["storage_backends"]
    return {
        "pipeline": store["store_pipeline"],
        "backends": backends.split(":") if isinstance(backends, str) else list(backends),
        "cache_buffer_capacity_gb": store.get("cache_buffer_capacity_gb", 0),
        "users": users,
    }
