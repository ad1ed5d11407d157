"""Several real SSH hosts on one machine: one network namespace per host on a private bridge,
each with its own sshd, hostname and port space (needs root)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import random
import re
import shlex
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
# The network namespaces this test process made and has not deleted (their inodes): what runs in
# them is its own, whatever test workers beside it run in theirs (tests/support/leftovers.py).
MADE_HERE: set[int] = set()


@dataclass
class Host:
    name: str
    address: str
    netns: str
    sshd: subprocess.Popen[bytes] | None = None
    cgroup: Path | None = None  # its own CPU share, when the cluster was made with one


@dataclass
class Cluster:
    base: Path  # outside /tmp; <base>/shared is one folder for all hosts
    key: Path
    ssh_config: Path
    hosts: list[Host] = field(default_factory=list)
    subnet: str = ""  # the bridge's /24, e.g. 10.213.7
    # With containers: every host's podman sees the images built here (build them with image_env)
    image_store: Path | None = None
    image_env: dict[str, str] = field(default_factory=dict)

    @property
    def unused_address(self) -> str:
        """An address on the test bridge with no host behind it: traffic stays on the bridge."""
        return f"{self.subnet}.250"

    @property
    def shared(self) -> Path:
        return self.base / "shared"

    @property
    def known_hosts(self) -> Path:
        """The hosts' SSH host keys, as a user's known_hosts holds them (the SSH config's file)."""
        return self.base / "known_hosts"

    @property
    def private(self) -> Path:
        """The same path on every host, but a different folder behind it on each."""
        return self.base / "private"

    @property
    def private_homes(self) -> bool:
        """Whether every host has its own home folder (an overlay on this machine's)."""
        return all((self.base / h.name / "private-home").exists() for h in self.hosts)

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
        from tests.support.processes import carries_marker

        mark = f"/{deployment}/".encode()
        return [(host, pid) for host, pid in self.pids() if carries_marker(pid, mark)]


def available() -> str | None:
    """Why the fixture cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespaces and sshd need root"
    for tool in ("ip", "unshare", "ssh-keygen", SSHD):
        if shutil.which(tool) is None and not Path(tool).exists():
            return f"{tool} is missing (scripts/setup.sh installs it)"
    return None


def _cpu_hierarchy() -> tuple[Path, str] | None:
    """Where per-host CPU cgroups can be made: cgroup v1's cpu hierarchy, or v2 with the cpu
    controller; None if neither is writable here."""
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        return v1, "v1"
    with contextlib.suppress(OSError):
        if "cpu" in (v2 / "cgroup.controllers").read_text().split() and os.access(v2, os.W_OK):
            return v2, "v2"
    return None


def cpu_limits_available() -> str | None:
    """Why hosts cannot get their own CPU shares here, or None."""
    return None if _cpu_hierarchy() else "no writable cgroup cpu controller (cgroup v1 cpu or v2 +cpu)"


def _cpu_cgroup(name: str, cpus: float) -> Path:
    """A new cgroup limited to `cpus` cores (CFS quota over a 100 ms period)."""
    found = _cpu_hierarchy()
    if found is None:
        raise RuntimeError(cpu_limits_available())
    root, version = found
    period, quota = 100_000, max(1_000, round(cpus * 100_000))
    group = root / name
    group.mkdir()
    if version == "v1":
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    else:
        with contextlib.suppress(OSError):  # already enabled is fine
            (root / "cgroup.subtree_control").write_text("+cpu")
        (group / "cpu.max").write_text(f"{quota} {period}")
    return group


def _remove_cgroup(group: Path) -> None:
    deadline = time.monotonic() + 10
    while True:  # killed processes leave their cgroup a moment after SIGKILL
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@contextlib.contextmanager
def cluster(
    count: int = 4, cpus_per_host: float | None = None, containers: bool = False
) -> Iterator[Cluster]:
    """`count` hosts; with `cpus_per_host`, each host's sshd and everything started under it
    (sessions, servers) shares one CPU cgroup limited to that many cores, as if each host were a
    machine of its own, rather than all hosts taking turns on every core here.

    With `containers`, podman works from SSH sessions (sshd runs under `nsenter --net`, not `ip
    netns exec`, which remounts /sys and hides the cgroups from runc), and each host has its own
    podman: its own /etc/containers, /var/lib/containers and /run/containers (folders of its own
    bound over them), so its containers are its own; images built into `Cluster.image_store` with
    `Cluster.image_env` are seen, read-only, by every host."""
    tag = uuid.uuid4().hex[:4]
    base = Path("/var/tmp") / f"ucmctl-hosts-{uuid.uuid4().hex[:8]}"
    (base / "shared").mkdir(parents=True)
    bridge = f"ucmb{tag}"
    key = base / "client_key"
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
    (base / "authorized_keys").write_text((base / "client_key.pub").read_text())
    ssh_config = base / "ssh_config"
    c = Cluster(base=base, key=key, ssh_config=ssh_config)
    config_lines = []
    known_lines: list[str] = []
    try:
        if containers:
            from tests.support.containers import podman, storage_root, write_podman_config

            c.image_env = write_podman_config(base / "images")
            c.image_store = storage_root(base / "images")
            podman(c.image_env, "images")  # the store exists before a host opens it
            for mount_point in ("/var/lib/containers", "/run/containers"):
                Path(mount_point).mkdir(parents=True, exist_ok=True)
        c.subnet = subnet = _bridge_on_a_free_subnet(bridge)
        Path("/run/sshd").mkdir(exist_ok=True)
        for i in range(1, count + 1):
            name, ns, veth = f"h{i}", f"ucm{tag}h{i}", f"ucv{tag}{i}"
            address = f"{subnet}.{10 + i}"
            c.hosts.append(Host(name, address, ns))
            _sh("ip", "netns", "add", ns)
            MADE_HERE.add(os.stat(f"/run/netns/{ns}").st_ino)
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
            # Its own hostname (UTS namespace), its own folder behind <base>/private, and its own
            # home folder: an overlay on the user's, so what logins write there (shell start-up
            # files such as pyenv's rehash do, under a lock) stays on this host, as on a machine
            # of its own. Without overlayfs, the hosts share the home folder (`private_homes`).
            user_home = pwd.getpwuid(os.geteuid()).pw_dir
            layers = f"lowerdir={user_home},upperdir={home}/home-upper,workdir={home}/home-work"
            (home / "home-upper").mkdir()
            (home / "home-work").mkdir()
            _no_rehash_on_login(Path(user_home), home / "home-upper")
            overlay = f"mount -t overlay overlay -o {shlex.quote(layers)} {shlex.quote(user_home)}"
            boot = (f"hostname {name} && mount --bind {home}/private {c.private} && "
                    f"{{ ! {overlay} || touch {home}/private-home; }} && "
                    f"exec {SSHD} -D -e -f {cfg}")  # fmt: skip
            enter = ["ip", "netns", "exec", ns]
            if containers:
                enter = ["nsenter", f"--net=/run/netns/{ns}"]
                boot = f"{_own_podman(home / 'podman', c)} && {boot}"
            c.private.mkdir(exist_ok=True)
            h = c.hosts[-1]
            log = (home / "sshd.log").open("wb")
            h.sshd = subprocess.Popen(
                [*enter, "unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", boot],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            if cpus_per_host is not None:  # before sshd listens, so every session starts inside
                h.cgroup = _cpu_cgroup(f"ucmctl-{tag}-{name}", cpus_per_host)
                (h.cgroup / "cgroup.procs").write_text(str(h.sshd.pid))
            config_lines += [f"Host {name} {address}", f"  HostName {address}", "  User root",
                             f"  IdentityFile {key}", "  IdentitiesOnly yes",
                             f"  UserKnownHostsFile {c.known_hosts}", "  LogLevel ERROR", ""]  # fmt: skip
            # known to the user, as after a first `ssh` to it: ucmctl checks host keys
            pub = (home / "host_key.pub").read_text().split()
            known_lines.append(f"{name},{address} {pub[0]} {pub[1]}")
        ssh_config.write_text("\n".join(config_lines))
        c.known_hosts.write_text("\n".join(known_lines) + "\n")
        for h in c.hosts:
            _wait_port(h.address, 22, 15)
        yield c
    finally:
        _teardown(c, bridge)


def _no_rehash_on_login(user_home: Path, upper: Path) -> None:
    """A host's `.bashrc` without pyenv's rehash: sshd runs every command through the user's bash,
    which reads `.bashrc` (Debian's bash does for SSH), and this machine's runs `pyenv init -`,
    whose `pyenv rehash` waits up to 60 s for a lock file in the shims folder. A lock left behind
    (a rehash that did not end) held every later command on the host past ucmctl's timeouts (seen:
    `down` failing on both hosts at once, nothing stuck in the kernel). The host keeps the rest of
    the file (PATH and pyenv's shims as before); the shims are there already."""
    rc = user_home / ".bashrc"
    if rc.is_file() and "pyenv init -)" in (text := rc.read_text()):
        (upper / ".bashrc").write_text(text.replace("pyenv init -)", "pyenv init - --no-rehash)"))


def _bridge_on_a_free_subnet(bridge: str) -> str:
    """Make the bridge and give it a free 10.213.X.0/24: one no other bridge of this
    machine holds. Chosen and taken under a lock, so that clusters made at once (test workers side
    by side) never share a subnet: a shared one routes one cluster's connections to the other's."""
    with open("/run/ucmctl-test-subnets.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True)
        taken = {int(m) for m in re.findall(r"inet 10\.213\.(\d+)\.", used.stdout)}
        free = [n for n in range(1, 250) if n not in taken]
        if not free:
            raise RuntimeError("every 10.213.X.0/24 is taken by a bridge: test clusters left behind?")
        subnet = f"10.213.{random.SystemRandom().choice(free)}"
        _sh("ip", "link", "add", bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{subnet}.1/24", "dev", bridge)
        _sh("ip", "link", "set", bridge, "up")
        return subnet


def _own_podman(folder: Path, c: Cluster) -> str:
    """A host's own podman configuration and state in `folder`; the shell commands, run in the host's
    mount namespace, that put them in place of the machine's."""
    from tests.support.containers import write_podman_config

    assert c.image_store is not None
    shutil.copytree("/etc/containers", folder)  # policy.json, registries.conf
    write_podman_config(folder, image_stores=[c.image_store])
    binds = {"/etc/containers": folder, "/var/lib/containers": folder / "var-lib-containers",
             "/run/containers": folder / "run-containers"}  # fmt: skip
    for source in binds.values():
        source.mkdir(exist_ok=True)
    return " && ".join(f"mount --bind {source} {target}" for target, source in binds.items())


def _wait_port(address: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
            return
        time.sleep(0.1)
    raise TimeoutError(f"sshd on {address} did not listen within {timeout} s")


def _teardown(c: Cluster, bridge: str) -> None:
    for h in c.hosts:
        if c.image_store is not None and h.sshd is not None:  # the host's containers, its podman's way
            subprocess.run(["nsenter", f"--target={h.sshd.pid}", "--mount", "--net", "podman", "rm", "-af",
                            "-t", "0"], capture_output=True, timeout=120)  # fmt: skip
    for h in c.hosts:
        pids = subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        if h.sshd is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                h.sshd.wait(timeout=10)
    for h in c.hosts:
        if h.cgroup is not None:
            _remove_cgroup(h.cgroup)
        subprocess.run(["ip", "link", "del", f"ucv{bridge[4:]}{h.name[1:]}"], capture_output=True)
        # its processes are killed above: a namespace of the same number later is another's
        # (the kernel reuses the numbers: seen, the other CI lane's hosts taken for this one's)
        with contextlib.suppress(OSError):
            MADE_HERE.discard(os.stat(f"/run/netns/{h.netns}").st_ino)
        subprocess.run(["ip", "netns", "del", h.netns], capture_output=True)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    shutil.rmtree(c.base, ignore_errors=True)


@contextlib.contextmanager
def cluster_or_skip(
    count: int, cpus_per_host: float | None = None, containers: bool = False
) -> Iterator[Cluster]:
    """`cluster(...)` for a test, which is skipped where real SSH hosts (or, with `containers`,
    podman) cannot be made."""
    import pytest

    reason = available()
    if not reason and containers:
        from tests.support.containers import available as containers_available

        reason = containers_available()
    if reason:
        pytest.skip(f"needs real SSH hosts: {reason}")
    with cluster(count, cpus_per_host, containers) as c:
        yield c
