"""Several real SSH hosts on one machine: one network namespace per host on a private bridge,
each with its own sshd, hostname and port space (needs root)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


@dataclass
class Host:
    name: str
    address: str
    netns: str
    sshd: subprocess.Popen[bytes] | None = None


@dataclass
class Cluster:
    base: Path  # outside /tmp; <base>/shared is one folder for all hosts
    key: Path
    ssh_config: Path
    hosts: list[Host] = field(default_factory=list)
    subnet: str = ""  # the bridge's /24, e.g. 10.213.7

    @property
    def unused_address(self) -> str:
        """An address on the test bridge with no host behind it: traffic stays on the bridge."""
        return f"{self.subnet}.250"

    @property
    def shared(self) -> Path:
        return self.base / "shared"

    @property
    def private(self) -> Path:
        """The same path on every host, but a different folder behind it on each."""
        return self.base / "private"

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def run(self, host: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.host(host).netns, *argv],
                              capture_output=True, text=True, check=False)  # fmt: skip

    def stop_sshd(self, name: str) -> None:
        h = self.host(name)
        if h.sshd is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(h.sshd.pid, signal.SIGKILL)
            h.sshd.wait(timeout=10)
            h.sshd = None

    def pids(self) -> list[tuple[str, int]]:
        """(host, pid) of every process in the hosts' network namespaces."""
        found = []
        for h in self.hosts:
            listed = subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True, text=True)
            found += [(h.name, int(pid)) for pid in listed.stdout.split()]
        return found

    def commands_mentioning(self, text: str) -> list[str]:
        """Command lines of live processes on the hosts that contain `text` (say, helper shells
        that ucmctl left running there)."""
        found = []
        for _, pid in self.pids():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                if text in cmdline:
                    found.append(cmdline)
        return found

    def processes_of(self, deployment: str) -> list[tuple[str, int]]:
        """(host, pid) of every live process anywhere that carries a marker of `deployment`."""
        found = []
        mark = f"/{deployment}/".encode()
        for host, pid in self.pids():
            with contextlib.suppress(OSError):
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                ours = any(e.startswith(b"UCMCTL_PROCESS=") and mark in e for e in env)
                if stat != "Z" and ours:
                    found.append((host, pid))
        return found


def available() -> str | None:
    """Why the fixture cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespaces and sshd need root"
    for tool in ("ip", "unshare", "ssh-keygen", SSHD):
        if shutil.which(tool) is None and not Path(tool).exists():
            return f"{tool} is missing (scripts/setup.sh installs it)"
    return None


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@contextlib.contextmanager
def cluster(count: int = 4) -> Iterator[Cluster]:
    tag = f"{random.randrange(16**4):04x}"
    subnet = f"10.213.{random.randrange(1, 250)}"
    base = Path("/var/tmp") / f"ucmctl-hosts-{uuid.uuid4().hex[:8]}"
    (base / "shared").mkdir(parents=True)
    bridge = f"ucmb{tag}"
    key = base / "client_key"
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
    (base / "authorized_keys").write_text((base / "client_key.pub").read_text())
    ssh_config = base / "ssh_config"
    c = Cluster(base=base, key=key, ssh_config=ssh_config, subnet=subnet)
    config_lines = []
    try:
        _sh("ip", "link", "add", bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{subnet}.1/24", "dev", bridge)
        _sh("ip", "link", "set", bridge, "up")
        Path("/run/sshd").mkdir(exist_ok=True)
        for i in range(1, count + 1):
            name, ns, veth = f"h{i}", f"ucm{tag}h{i}", f"ucv{tag}{i}"
            address = f"{subnet}.{10 + i}"
            c.hosts.append(Host(name, address, ns))
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "link", "set", veth, "master", bridge, "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            home = base / name
            (home / "private").mkdir(parents=True)
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / "host_key"))
            cfg = home / "sshd_config"
            cfg.write_text(
                f"ListenAddress {address}\nPort 22\nPidFile {home}/sshd.pid\nHostKey {home}/host_key\n"
                f"AuthorizedKeysFile {base}/authorized_keys\nPermitRootLogin prohibit-password\nUsePAM no\n"
                "StrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                "Subsystem sftp /usr/lib/openssh/sftp-server\nMaxStartups 200\nMaxSessions 200\n"
                "AcceptEnv LANG\nPrintMotd no\n"
            )
            # Its own hostname (UTS namespace) and its own folder behind <base>/private.
            boot = (f"hostname {name} && mount --bind {home}/private {c.private} && "
                    f"exec {SSHD} -D -e -f {cfg}")  # fmt: skip
            c.private.mkdir(exist_ok=True)
            h = c.hosts[-1]
            log = (home / "sshd.log").open("wb")
            h.sshd = subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "--propagation", "private",
                 "sh", "-c", boot],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            config_lines += [f"Host {name} {address}", f"  HostName {address}", "  User root",
                             f"  IdentityFile {key}", "  IdentitiesOnly yes", "  StrictHostKeyChecking no",
                             "  UserKnownHostsFile /dev/null", "  LogLevel ERROR", ""]  # fmt: skip
        ssh_config.write_text("\n".join(config_lines))
        for h in c.hosts:
            _wait_port(h.address, 22, 15)
        yield c
    finally:
        _teardown(c, bridge)


def _wait_port(address: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
            return
        time.sleep(0.1)
    raise TimeoutError(f"sshd on {address} did not listen within {timeout} s")


def _teardown(c: Cluster, bridge: str) -> None:
    for h in c.hosts:
        pids = subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        if h.sshd is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                h.sshd.wait(timeout=10)
    for h in c.hosts:
        subprocess.run(["ip", "link", "del", f"ucv{bridge[4:]}{h.name[1:]}"], capture_output=True)
        subprocess.run(["ip", "netns", "del", h.netns], capture_output=True)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    shutil.rmtree(c.base, ignore_errors=True)


@contextlib.contextmanager
def cluster_or_skip(count: int) -> Iterator[Cluster]:
    """`cluster(count)` for a test, which is skipped where real SSH hosts cannot be made."""
    import pytest

    reason = available()
    if reason:
        pytest.skip(f"needs real SSH hosts: {reason}")
    with cluster(count) as c:
        yield c
