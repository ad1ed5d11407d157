"""A result's provenance: where it came from (versions, revision, host, command line,
topology), where the run went (the deployment's plan digest, engine, nodes; --url's host), and
one digest of its prompts."""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import importlib.metadata
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ucmctl import __version__
from ucmctl.bench import loop
from ucmctl.topology.digest_compat import without_newer

if TYPE_CHECKING:
    from ucmctl.bench.results import Cell


def _git_revision() -> str | None:
    root = Path(__file__).resolve().parents[2]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _memory_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


def provenance(
    topology_digest: str | None = None, topology_path: str | None = None, argv: list[str] | None = None
) -> dict[str, Any]:
    """Where a result came from: versions, revision, host, command line, topology."""
    with contextlib.suppress(KeyError, OSError):
        user = getpass.getuser()
    return {
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command_line": shlex.join(argv if argv is not None else ["ucmctl", *sys.argv[1:]]),
        "ucmctl_version": __version__,
        "vllm_version": _version("vllm"),
        "git_revision": _git_revision(),
        "topology_digest": topology_digest,
        "topology_path": topology_path,
        "event_loop": loop.name(),
        "host": {
            "hostname": socket.gethostname(),
            "user": locals().get("user"),
            "platform": platform.platform(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "memory_bytes": _memory_bytes(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        },
    }


def deployment_facts(record: Any | None, model: str | None, url: str | None) -> dict[str, Any]:
    """What the provenance says of where a run went: the model, and for a deployment the plan's
    digest, its engine and mode and, per node, its platform, devices, images and what `up`'s
    preflight read there (engine, torch and Python versions, device and CPU model, image ids);
    for --url, the server's host (no port: a server started again elsewhere on it is the same
    setup; no credentials)."""
    from urllib.parse import urlsplit

    out: dict[str, Any] = {"model": model}
    if url is not None:
        parts = urlsplit(url)
        out["url"] = f"{parts.scheme}://{parts.hostname}"
    if record is None:
        return out
    plan = record.plan
    if model is None:
        from ucmctl.bench.runner import model_path_of

        out["model"] = model_path_of(plan)
    dumped = without_newer("plan", plan.model_dump(mode="json"))  # digests as the history's
    out["plan_digest"] = hashlib.sha256(json.dumps(dumped, sort_keys=True).encode()).hexdigest()[:16]
    out["engine"], out["mode"] = plan.engine, plan.mode
    nodes: dict[str, dict[str, Any]] = {}
    for name, node in sorted(plan.nodes.items()):
        facts: dict[str, Any] = {"platform": node.platform, "devices": node.devices}
        images = sorted({p.container.image for p in plan.on_node(name) if p.container is not None})
        if images:
            facts["images"] = ",".join(images)
        facts.update(record.node_facts.get(name, {}))
        nodes[name] = facts
    out["nodes"] = nodes
    return out


def prompts_digest(cells: list[Cell]) -> str | None:
    """One digest of every cell's prompts, for the provenance."""
    parts = [c.prompts_digest for c in cells if c.prompts_digest]
    if not parts:
        return None
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
