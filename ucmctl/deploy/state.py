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
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ucmctl.deploy.kv_probe import ProbeResult
from ucmctl.errors import ExitStatus, UcmctlError
from ucmctl.plan.model import Plan
from ucmctl.topology.model import NAME_RE


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

    schema_version: int = 1
    deployment: str
    topology_path: str
    topology_digest: str
    created_at: float = Field(default_factory=time.time)
    status: str = "starting"  # starting | up | failed | stopped
    plan: Plan
    processes: dict[str, ProcessState] = Field(default_factory=dict)
    kv_probe: ProbeResult | None = None  # the last proof that KV reached decode (deploy/kv_probe.py)


@dataclass(frozen=True)
class Endpoints:
    proxy: str | None
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
            return Record.model_validate_json(path.read_text())
        except ValueError as exc:
            raise UcmctlError.one(f"unreadable deployment record: {exc}", file=str(path),
                                  fix="remove it after `ucmctl down TOPOLOGY`") from None  # fmt: skip

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
    """The proxy and every API server of a deployment that is up."""
    record = (store or StateStore()).load(deployment)
    if record is None:
        raise UcmctlError.one(f"no deployment named '{deployment}' on this machine",
                              fix="see `ucmctl status`, or pass --url")  # fmt: skip
    proxy = None
    instances = []
    for p in record.plan.processes:
        if p.role == "proxy":
            proxy = p.url
        elif p.role in ("prefill", "decode", "mixed") and p.url:
            instances.append((p.name, p.role, p.url))
    return Endpoints(proxy, instances)
