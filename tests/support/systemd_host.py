"""A test host whose init is systemd: the host's network namespace booted as a container by
`systemd-nspawn --volatile=yes` (a root of its own in memory, this machine's /usr read-only), its
sshd then started inside it, so that SSH sessions to the host run where systemd is PID 1 and
`systemd-run` reaches it. The cluster's folder (keys, the shared folder, the nodes' workdirs)
is bound in read-write, the checkout and the Python under the test run read-only. Nothing it
does reaches this machine's files: tmpfiles' boot clean-up is masked as well (a bound folder
under /tmp would be emptied by it)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.netns import SSHD, Cluster, _wait_port

REPO = Path(__file__).resolve().parents[2]
NSPAWN = "/usr/bin/systemd-nspawn"
# tmpfiles' boot clean-up, and the services this machine has installed for other tests
_MASKED = ("systemd-tmpfiles-setup.service", "systemd-tmpfiles-clean.timer", "ssh.service",
           "glusterd.service", "munge.service", "slurmd.service", "slurmctld.service", "docker.service",
           "docker.socket", "containerd.service", "prometheus.service", "podman.socket")  # fmt: skip


def available() -> str | None:
    """Why a systemd host cannot be made here, or None."""
    if not Path(NSPAWN).exists():
        return "systemd-nspawn is not installed (Debian's systemd-container)"
    if not Path("/lib/systemd/systemd").exists():
        return "systemd is not installed"
    return None


def _leader(nspawn: subprocess.Popen[bytes]) -> int | None:
    """The container's PID 1 as this machine sees it: nspawn's child running systemd."""
    found = subprocess.run(
        ["ps", "-o", "pid=,comm=", "--ppid", str(nspawn.pid)], capture_output=True, text=True
    )
    for line in found.stdout.splitlines():
        pid, _, comm = line.strip().partition(" ")
        if comm.strip() == "systemd":
            return int(pid)
    return None


def inside(pid: int, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """`argv` in every namespace of the container whose PID 1 is `pid`."""
    return subprocess.run(["nsenter", "-t", str(pid), "-a", *argv], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@contextlib.contextmanager
def systemd_init(c: Cluster, name: str) -> Iterator[int]:
    """Host `name` of `c` with systemd as its init, until the block ends; yields the container's
    PID 1 (as this machine sees it). Its sshd (the cluster's, on its address) runs inside."""
    h = c.host(name)
    c.stop_sshd(name)
    home = c.base / name
    # from this machine's /etc: the accounts sshd needs (its privilege separation user) and the
    # alternatives the commands ucmctl runs are reached by (awk)
    etc = ("passwd", "group", "alternatives")
    binds = [f"--bind={c.base}", f"--bind-ro={REPO}", *(f"--bind-ro=/etc/{x}" for x in etc)]
    prefix = Path(sys.base_prefix).resolve()
    if not str(prefix).startswith("/usr"):
        binds.append(f"--bind-ro={prefix}")
    log = (home / "nspawn.log").open("wb")
    nspawn = subprocess.Popen(
        [NSPAWN, "-D", "/", "--volatile=yes", "--register=no", "--keep-unit", "-b", "-M", name,
         f"--network-namespace-path=/run/netns/{h.netns}", *binds,
         "systemd.firstboot=off", "systemd.unit=multi-user.target",
         *(f"systemd.mask={unit}" for unit in _MASKED)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    pid = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pid = pid or _leader(nspawn)
            if pid is not None:
                state = inside(pid, "systemctl", "is-system-running").stdout.strip()
                if state in ("running", "degraded"):
                    break
            if nspawn.poll() is not None:
                raise RuntimeError(f"systemd-nspawn ended: {(home / 'nspawn.log').read_text()[-2000:]}")
            time.sleep(0.5)
        else:
            raise TimeoutError(f"{name}'s systemd did not finish booting in 60 s")
        assert pid is not None
        inside(pid, "mkdir", "-p", "/run/sshd")
        sshd_log = (home / "sshd.log").open("ab")
        h.sshd = subprocess.Popen(
            ["nsenter", "-t", str(pid), "-a", SSHD, "-D", "-e", "-f", str(home / "sshd_config")],
            stdout=sshd_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            _wait_port(h.address, 22, 15)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {(home / 'sshd.log').read_text()[-2000:]}") from None
        yield pid
    finally:
        c.stop_sshd(name)
        if nspawn.poll() is None:
            nspawn.send_signal(signal.SIGTERM)  # nspawn asks the container's systemd to power off
            try:
                nspawn.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(nspawn.pid, signal.SIGKILL)
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                nspawn.wait(timeout=30)
