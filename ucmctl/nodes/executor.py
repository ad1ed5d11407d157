"""The only things that touch a machine: run a shell command, put a file. Local or over SSH."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ucmctl.core.errors import ExitStatus, Problem, UcmctlError
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


class NodeError(UcmctlError):
    """A node could not be reached or a command on it failed."""

    status = ExitStatus.FAILURE

    def __init__(self, node: str, message: str) -> None:
        self.node = node
        self.reason = message
        super().__init__([Problem(f"node {node}: {message}")])


class HostKeyError(NodeError):
    """The node's SSH host key is unknown (and not opted in) or differs from the known one."""


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

    def hold(self, command: str, *, timeout: float = 30) -> tuple[str, Watch]:
        """Start `command`, return what it printed up to a line `held` (or its end) and the Watch
        that ends it: for something the node keeps only while this channel stays open."""
        ...

    def close(self) -> None: ...


HELD = "held"


def _read_until_held(node: str, recv: Callable[[float], bytes], timeout: float) -> str:
    """Output up to and including the line `held`, or all of it when the command ends first."""
    deadline = time.monotonic() + timeout
    data = b""
    while HELD not in data.decode(errors="replace").splitlines():
        try:
            chunk = recv(max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            raise NodeError(node, f"no answer after {timeout:.0f} s") from None
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


class LocalExecutor:
    """This machine, through subprocess."""

    def __init__(self, node: NodePlan) -> None:
        self.node = node

    def argv(self, command: str) -> list[str]:
        """What runs `command` on the node: here, /bin/sh."""
        return ["/bin/sh", "-c", command]

    def run(self, command: str, *, timeout: float = 60) -> Result:
        try:
            done = subprocess.run(
                self.argv(command),
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
                self.argv(command),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )

    def hold(self, command: str, *, timeout: float = 30) -> tuple[str, Watch]:
        process = subprocess.Popen(
            self.argv(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        watch = _LocalWatch(process)
        assert process.stdout is not None
        fd = process.stdout.fileno()

        def recv(left: float) -> bytes:
            if not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            return os.read(fd, 4096)

        try:
            return _read_until_held(self.node.name, recv, timeout), watch
        except BaseException:
            watch.close()
            raise

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

    def __init__(
        self,
        node: NodePlan,
        *,
        connect_timeout: float = 10,
        ssh_config: str | None = None,
        accept_new_host_keys: bool = False,
    ) -> None:
        import fabric  # imported here: local topologies need no SSH stack

        from ucmctl.nodes import host_keys

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
        # Fabric accepts any host key; known keys are checked and unknown ones refused instead.
        host_keys.configure(self._conn.client, self._conn.ssh_config, accept_new=accept_new_host_keys)
        self._lock = threading.Lock()  # one paramiko transport, used from several threads
        self._dirs: set[str] = set()

    def _connect(self) -> None:
        from ucmctl.nodes import host_keys

        try:
            self._conn.open()
        except Exception as exc:  # paramiko and socket raise many kinds: all mean unreachable
            refused = host_keys.describe(exc, self._conn.host, self._conn.port)
            if refused is not None:
                raise HostKeyError(self.node.name, refused) from None
            reason = str(exc) or type(exc).__name__
            raise NodeError(
                self.node.name,
                f"SSH to {self.node.user}@{self.node.host}:{self.node.ssh_port} failed: {reason}",
            ) from None

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

    def hold(self, command: str, *, timeout: float = 30) -> tuple[str, Watch]:
        watch = self.watch(command)
        assert isinstance(watch, _SshWatch)
        channel = watch.channel

        def recv(left: float) -> bytes:
            channel.settimeout(left)
            return bytes(channel.recv(4096))  # socket.timeout is TimeoutError

        try:
            return _read_until_held(self.node.name, recv, timeout), watch
        except BaseException:
            watch.close()
            raise

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
        if self._process.stdout is not None:
            self._process.stdout.close()


class _SshWatch:
    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def finished(self) -> bool:
        return bool(self.channel.exit_status_ready() or self.channel.closed)

    def close(self) -> None:
        self.channel.close()


def executor_for(
    node: NodePlan, *, connect_timeout: float = 10, accept_new_host_keys: bool = False
) -> Executor:
    if node.transport == "local":
        return LocalExecutor(node)
    return SshExecutor(node, connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys)
