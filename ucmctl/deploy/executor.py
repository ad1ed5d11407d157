"""The only things that touch a machine: run a shell command, put a file. Local or over SSH."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ucmctl.plan.model import NodePlan


@dataclass(frozen=True)
class Result:
    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class NodeError(Exception):
    """A node could not be reached or a command on it failed."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"node {node}: {message}")
        self.node = node
        self.reason = message


class Watch(Protocol):
    """A command left running on a node, for as long as something there holds."""

    def finished(self) -> bool: ...

    def close(self) -> None:
        """Stop it (a remote loop ends at its next write to the closed channel)."""
        ...


class Executor(Protocol):
    node: NodePlan

    def run(self, command: str, *, timeout: float = 60) -> Result:
        """Run `command` with /bin/sh on the node; never raises for a non-zero exit."""
        ...

    def put(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        """Write a file on the node atomically (parent folders are created)."""
        ...

    def watch(self, command: str) -> Watch:
        """Start `command` and return at once: one round trip for a long wait, not one per look."""
        ...

    def close(self) -> None: ...


class LocalExecutor:
    """This machine, through subprocess."""

    def __init__(self, node: NodePlan) -> None:
        self.node = node

    def run(self, command: str, *, timeout: float = 60) -> Result:
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", command],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise NodeError(self.node.name, f"command timed out after {timeout:.0f} s") from None
        return Result(command, done.returncode, done.stdout, done.stderr)

    def watch(self, command: str) -> Watch:
        return _LocalWatch(
            subprocess.Popen(
                ["/bin/sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )

    def put(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")  # unique: see SshExecutor.put
        tmp.write_bytes(content.encode() if isinstance(content, str) else content)
        os.chmod(tmp, mode)
        os.replace(tmp, target)

    def close(self) -> None:
        pass


class SshExecutor:
    """A node over SSH (Fabric): key auth, ~/.ssh/config honoured, connect timeout."""

    # paramiko logs failed connections with tracebacks; ucmctl reports them as one line itself.
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    logging.getLogger("paramiko").propagate = False

    def __init__(self, node: NodePlan, *, connect_timeout: float = 10, ssh_config: str | None = None) -> None:
        import fabric  # imported here: local topologies need no SSH stack

        self.node = node
        config_path = ssh_config or os.environ.get("UCMCTL_SSH_CONFIG")
        config = fabric.Config(runtime_ssh_path=config_path) if config_path else fabric.Config()
        connect_kwargs: dict[str, object] = {"allow_agent": True, "look_for_keys": True}
        if node.key:
            connect_kwargs["key_filename"] = os.path.expanduser(node.key)
        self._conn = fabric.Connection(
            host=node.host,
            user=node.user,
            port=node.ssh_port,
            config=config,
            connect_timeout=connect_timeout,
            connect_kwargs=connect_kwargs,
        )
        self._lock = threading.Lock()  # one paramiko transport, used from several threads
        self._dirs: set[str] = set()

    def _connect(self) -> None:
        try:
            self._conn.open()
        except Exception as exc:  # paramiko and socket raise many kinds: all mean unreachable
            reason = str(exc) or type(exc).__name__
            raise NodeError(self.node.name, f"SSH to {self.node.user}@{self.node.host}:{self.node.ssh_port} "
                            f"failed: {reason}") from None  # fmt: skip

    def run(self, command: str, *, timeout: float = 60) -> Result:
        with self._lock:
            self._connect()
        try:
            done = self._conn.run(
                f"/bin/sh -c {shlex.quote(command)}", hide=True, warn=True, timeout=timeout, in_stream=False
            )
        except Exception as exc:
            if "CommandTimedOut" in type(exc).__name__:
                raise NodeError(self.node.name, f"command timed out after {timeout:.0f} s") from None
            raise NodeError(self.node.name, f"SSH command failed: {exc}") from None
        return Result(command, done.exited, done.stdout, done.stderr)

    def put(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        import io

        parent = os.path.dirname(path)
        # A name of its own for each write: several nodes may put the same path on one shared
        # filesystem at once (install --wheel), and a shared temp name loses all but one rename.
        tmp = f"{path}.{uuid.uuid4().hex[:12]}.tmp"
        self._makedirs([parent])
        with self._lock:
            self._connect()
            try:
                sftp = self._conn.sftp()
                data = content.encode() if isinstance(content, str) else content
                sftp.putfo(io.BytesIO(data), tmp)
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, path)
            except OSError as exc:
                raise NodeError(self.node.name, f"cannot write {path}: {exc}") from None

    def _makedirs(self, paths: list[str]) -> None:
        """Create folders in one round trip; remembered, so a later put needs no second one."""
        missing = sorted({p for p in paths if p not in self._dirs})
        if not missing:
            return
        made = self.run("mkdir -p " + " ".join(shlex.quote(p) for p in missing))
        if not made.ok:
            raise NodeError(self.node.name, f"cannot create {', '.join(missing)}: {made.stderr.strip()}")
        self._dirs.update(missing)

    def watch(self, command: str) -> Watch:
        with self._lock:
            self._connect()
            try:
                channel = self._conn.client.get_transport().open_session()
                channel.exec_command(f"/bin/sh -c {shlex.quote(command)}")
            except Exception as exc:
                raise NodeError(self.node.name, f"SSH command failed: {exc}") from None
        return _SshWatch(channel)

    def close(self) -> None:
        self._conn.close()


class _LocalWatch:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    def finished(self) -> bool:
        return self._process.poll() is not None

    def close(self) -> None:
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGTERM)
        self._process.wait()


class _SshWatch:
    def __init__(self, channel: Any) -> None:
        self._channel = channel

    def finished(self) -> bool:
        return bool(self._channel.exit_status_ready() or self._channel.closed)

    def close(self) -> None:
        self._channel.close()


def executor_for(node: NodePlan, *, connect_timeout: float = 10) -> Executor:
    if node.transport == "local":
        return LocalExecutor(node)
    return SshExecutor(node, connect_timeout=connect_timeout)
