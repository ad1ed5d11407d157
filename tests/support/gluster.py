"""A real network filesystem between the test hosts: a GlusterFS volume (one brick) served from
one host's network namespace and FUSE-mounted on every host, at the same path, in each host's own
mount namespace (the one its sshd and everything started over SSH run in). What a process on h2
reads there went through h2's glusterfs client and the bridge to the brick on the server.

GlusterFS 10 on Debian 12 (shared/docs/containers-and-network-fs.md): glusterd runs under
`nsenter --net` (not `ip netns exec`, which gives it a mount table of its own) with a volfile of
the test's (its state, sockets and logs in the test's folder); the brick process it spawns is in
the same namespace. With `coherent` (the default), the volume and the mounts use the settings that
make a rename on one host seen at once on another (quick-read, open-behind, stat-prefetch off;
entry, attribute and negative timeouts 0); without, GlusterFS's defaults, stale for ~1 s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.netns import Cluster
from tests.support.processes import alive as _alive

COHERENT_OPTIONS = {"performance.quick-read": "off", "performance.open-behind": "off",
                    "performance.stat-prefetch": "off"}  # fmt: skip
COHERENT_MOUNT = ["--entry-timeout=0", "--attribute-timeout=0", "--negative-timeout=0"]


def available() -> str | None:
    """Why a volume cannot be served here, or None."""
    if os.geteuid() != 0:
        return "glusterd and FUSE mounts need root"
    for tool in ("glusterd", "gluster", "glusterfs", "nsenter", "catatonit"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (scripts/setup.sh installs GlusterFS)"
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is missing"
    return None


@dataclass
class Volume:
    hosts: Cluster
    name: str
    server: str  # the host whose network namespace serves it
    base: Path  # glusterd's state, sockets, logs
    brick: Path  # the brick's folder (the server's local filesystem)
    mount: Path  # where every host sees the volume (in its own mount namespace)
    coherent: bool
    glusterd: subprocess.Popen[bytes] | None = None
    mounted: list[tuple[str, Path]] = field(default_factory=list)  # (host, mount point)

    @property
    def address(self) -> str:
        return self.hosts.host(self.server).address

    @property
    def sock(self) -> Path:
        return self.base / "run" / "glusterd.socket"

    def gluster(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """The gluster CLI against this volume's glusterd."""
        argv = ["gluster", f"--glusterd-sock={self.sock}", "--mode=script", *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(args)}: {done.stdout}{done.stderr}")
        return done

    def enter(self, host: str, wd: Path | None = None) -> list[str]:
        """The command prefix that runs in the host's network and mount namespaces (where its SSH
        sessions run), in folder `wd` there."""
        h = self.hosts.host(host)
        assert h.sshd is not None, f"{host} has no sshd"
        return ["nsenter", f"--target={h.sshd.pid}", "--mount", "--net", *([f"--wd={wd}"] if wd else [])]

    def on(
        self, host: str, *argv: str, timeout: float = 60, wd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`argv` in the host's network and mount namespaces, in folder `wd` there."""
        return subprocess.run(
            [*self.enter(host, wd), *argv], capture_output=True, text=True, timeout=timeout, check=False
        )

    def mount_on(
        self, host: str, timeout: float = 30, at: Path | None = None, coherent: bool | None = None,
        options: list[str] | None = None,
    ) -> Path:  # fmt: skip
        """The FUSE client on `host` (at the volume's mount, or `at`: a second client of the
        same volume; coherent or with GlusterFS's default caching as the volume is, unless
        said; `options`: more client flags), ready when the mount answers a stat as GlusterFS;
        the mount point."""
        at = at or self.mount
        log, pid = self._client_files(host, at)
        self._wait_gone(pid)  # an earlier client with this pidfile must be gone first
        options = (COHERENT_MOUNT if (self.coherent if coherent is None else coherent) else []) + (
            options or []
        )
        done = self.on(host, *STORAGE_FIRST, "glusterfs", f"--volfile-server={self.address}",
                       f"--volfile-id={self.name}", *options, f"--log-file={log}", f"--pid-file={pid}",
                       str(at))  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"glusterfs mount on {host}: {done.stderr or log.read_text()[-2000:]}")
        self.mounted.append((host, at))
        deadline = time.monotonic() + timeout
        while self.fs_type(host, at) not in ("fuseblk", "fuse"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{at} on {host} is not mounted; see {log}")
            time.sleep(0.1)
        return at

    def unmount_on(self, host: str, at: Path | None = None) -> None:
        at = at or self.mount
        self.on(host, "umount", "-l", str(at))
        self._wait_gone(self._client_files(host, at)[1])
        if (host, at) in self.mounted:
            self.mounted.remove((host, at))

    def _client_files(self, host: str, at: Path) -> tuple[Path, Path]:
        """The log and the pid file of `host`'s client mounted at `at`."""
        tag = host if at == self.mount else f"{host}-{at.name}"
        return self.base / f"client-{tag}.log", self.base / "run" / f"client-{tag}.pid"

    def wait_serving(self, timeout: float = 120) -> float:
        """Until every client mounted answers a stat of its mount point (a call to the server:
        a client that has not reconnected says ENOTCONN); the seconds it took. After a restart
        the clients reconnect by themselves, ~3 s here, but a loaded CI machine took ~30."""
        start = time.monotonic()
        waiting = list(self.mounted)
        while waiting:
            waiting = [(h, at) for h, at in waiting if self.on(h, "stat", "-c", "%i", str(at)).returncode]
            if waiting and time.monotonic() - start > timeout:
                raise RuntimeError(f"the clients {waiting} did not reconnect within {timeout:.0f} s")
            if waiting:
                time.sleep(0.2)
        return time.monotonic() - start

    def wait_writable(self, within: float, times: int = 3, timeout: float = 120) -> float:
        """Until every client mounted writes and fsyncs 1 MiB into the volume in under `within`
        seconds `times` times in a row; the seconds it took. Answering a stat is not being back:
        after a brick's restart a loaded machine saw the first writes take over 2 s for a while
        (the clients reopen their files, the brick settles), which a store bounded at 2 s
        counts as failed saves."""
        start = time.monotonic()
        for host, at in self.mounted:
            probe, streak, last = at / f".ucmctl-probe-{host}", 0, "not tried"
            while streak < times:
                if time.monotonic() - start > timeout:
                    raise RuntimeError(f"{at} on {host} did not write 1 MiB in {within} s "
                                       f"{times} times in a row within {timeout:.0f} s ({last})")  # fmt: skip
                began = time.monotonic()
                done = self.on(host, "dd", "if=/dev/zero", f"of={probe}", "bs=1M", "count=1",
                               "conv=fsync", "status=none", timeout=timeout)  # fmt: skip
                took = time.monotonic() - began
                ok = done.returncode == 0 and took < within
                last = f"last: {took:.2f} s" if done.returncode == 0 else f"last: {done.stderr.strip()}"
                streak = streak + 1 if ok else 0
                if not ok:
                    time.sleep(0.2)
            self.on(host, "rm", "-f", str(probe))
        return time.monotonic() - start

    def fs_type(self, host: str, at: Path | None = None) -> str:
        return self.on(host, "stat", "-f", "-c", "%T", str(at or self.mount)).stdout.strip()

    def cut_server_link(self, seconds: float) -> None:
        """The serving host off the network for `seconds` (its side of the link down)."""
        ns = self.hosts.host(self.server).netns
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "down"], check=True)
        try:
            time.sleep(seconds)
        finally:
            subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up"], check=True)

    def brick_pids(self) -> list[int]:
        """The brick processes (glusterfsd) serving the volume."""
        return [pid for pid in _pids_with(f"--volfile-id {self.name}.") if "glusterfsd" in _cmdline(pid)]

    @staticmethod
    def _wait_gone(pidfile: Path, timeout: float = 10) -> None:
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text())
            deadline = time.monotonic() + timeout
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _pids_with(text: str) -> list[int]:
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    return [pid for pid in pids if text in _cmdline(pid)]


def _volfile(base: Path) -> str:
    return f"""volume management
    type mgmt/glusterd
    option working-directory {base}/state
    option run-directory {base}/run
    option glusterd-sockfile {base}/run/glusterd.socket
    option transport-type socket
    option transport.socket.listen-port 24007
    option ping-timeout 0
    option event-threads 1
end-volume
"""


# The volume's processes (glusterd, the bricks it starts, each host's FUSE client) run before the
# engines on the CPU, as on their own storage machines: on this one's 2 cores, a real vLLM beside
# them starved a healthy volume (saves past a 5 s bound, lookups past 2 s: a CI failure).
STORAGE_FIRST = ("nice", "-n", "-10")


@contextlib.contextmanager
def gluster_volume(
    hosts: Cluster, name: str = "kv", server: str = "h1", clients: list[str] | None = None,
    coherent: bool = True, brick_in_memory: str | None = None,
) -> Iterator[Volume]:  # fmt: skip
    """Volume `name` served from `server`, mounted on `clients` (default: every host) at
    `<hosts.base>/gluster-<name>`; stopped, unmounted and its processes gone afterwards.

    `brick_in_memory` (a tmpfs size, "1g"): the brick is a tmpfs of that size rather than a
    folder of this machine's disk, for tests of the network filesystem's faults whose bounds
    (seconds) a busy disk's latency would break on a healthy volume (a CI machine writing back
    gigabytes stalled the brick's file creations past 2 s)."""
    base = hosts.base / f"glusterd-{name}"
    for sub in ("state", "run", "brick"):
        (base / sub).mkdir(parents=True)
    if brick_in_memory:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={brick_in_memory},mode=0755",
                        f"ucmctl-brick-{name}", str(base / "brick")], check=True)  # fmt: skip
    mount = hosts.base / f"gluster-{name}"
    mount.mkdir()
    (base / "glusterd.vol").write_text(_volfile(base))
    vol = Volume(hosts, name, server, base, base / "brick", mount, coherent)
    ns = hosts.host(server).netns
    try:
        log = (base / "glusterd.out").open("wb")
        vol.glusterd = subprocess.Popen(
            # under catatonit, the reaper of the brick processes glusterd spawns (they leave it):
            # a killed brick must not stay a zombie that glusterd takes for a running one
            ["nsenter", f"--net=/run/netns/{ns}", *STORAGE_FIRST, "catatonit", "--", "glusterd", "-N",
             f"--volfile={base}/glusterd.vol", f"--pid-file={base}/run/glusterd.pid",
             f"--log-file={base}/glusterd.log"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 20
        while vol.gluster("volume", "list", check=False).returncode:
            if vol.glusterd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"glusterd did not answer; see {base}/glusterd.log")
            time.sleep(0.1)
        vol.gluster("volume", "create", name, f"{vol.address}:{vol.brick}", "force")
        if coherent:
            for key, value in COHERENT_OPTIONS.items():
                vol.gluster("volume", "set", name, key, value)
        vol.gluster("volume", "start", name)
        for host in clients if clients is not None else [h.name for h in hosts.hosts]:
            vol.mount_on(host)
        yield vol
    finally:
        _teardown(vol)


def _teardown(vol: Volume) -> None:
    """Unmount everywhere, stop the volume, then no glusterd, brick or client process is left."""
    for host, at in list(vol.mounted):
        with contextlib.suppress(Exception):
            vol.unmount_on(host, at)
    if vol.glusterd is not None and vol.glusterd.poll() is None:
        with contextlib.suppress(Exception):
            vol.gluster("volume", "stop", vol.name, "force", check=False, timeout=30)
    for pid in [*vol.brick_pids(), *_pids_with(f"--volfile-id={vol.name} "), *_pids_with(str(vol.base))]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if vol.glusterd is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(vol.glusterd.pid, signal.SIGKILL)
        vol.glusterd.wait(timeout=10)
    if os.path.ismount(vol.brick):
        subprocess.run(["umount", "-l", str(vol.brick)], check=False)
    shutil.rmtree(vol.base, ignore_errors=True)
    with contextlib.suppress(OSError):
        vol.mount.rmdir()
