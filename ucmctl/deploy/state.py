"""The local record of each deployment: enough for `down`, `status`, `logs` and `bench` to work
from a fresh shell. Nodes keep their own record too (the run directories), so `down TOPOLOGY`
works even when this one is lost."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ucmctl.deploy.kv_probe import ProbeResult
from ucmctl.errors import UcmctlError
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

    def remove(self, deployment: str) -> None:
        self.path(deployment).unlink(missing_ok=True)

    def all(self) -> list[Record]:
        if not self.root.is_dir():
            return []
        records = [self.load(p.stem) for p in sorted(self.root.glob("*.json"))]
        return [r for r in records if r is not None]


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
