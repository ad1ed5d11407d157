"""The test hosts themselves: each one must look like a machine of its own (hostname, home
folder, and, when asked for, a CPU share that every login and process on it is held to), or the
multi-host tests and `benchmarks/up_scaling.py` measure the wrong thing."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.support.netns import Cluster, cluster_or_skip, cpu_limits_available

pytestmark = [pytest.mark.root]


def ssh(c: Cluster, host: str, command: str) -> str:
    done = subprocess.run(["ssh", "-F", str(c.ssh_config), host, command],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.strip()


def test_hosts_have_their_own_hostname_and_home_folder() -> None:
    with cluster_or_skip(2) as c:
        assert c.private_homes
        assert [ssh(c, h, "hostname") for h in ("h1", "h2")] == ["h1", "h2"]
        name = f".ucmctl-home-check-{c.base.name}"
        ssh(c, "h1", f"echo written-on-h1 > ~/{name}")
        assert ssh(c, "h1", f"cat ~/{name}") == "written-on-h1"
        assert ssh(c, "h2", f"cat ~/{name} 2>/dev/null || echo absent") == "absent"
        assert ssh(c, "h1", "echo ~") == ssh(c, "h2", "echo ~")  # the same path, as on two machines
        # ... and the user's real home folder here is untouched.
        assert subprocess.run(["sh", "-c", f"test -e ~/{name}"]).returncode == 1


def test_a_lock_left_in_pyenvs_shims_does_not_hold_a_login() -> None:
    """This machine's `.bashrc` runs `pyenv init -`, whose rehash waits up to 60 s for a lock
    file: a host's logins skip the rehash, so a lock left behind holds no command."""
    rc = Path.home() / ".bashrc"
    if not (rc.is_file() and "pyenv init -)" in rc.read_text()):
        pytest.skip("no pyenv in this user's .bashrc")
    with cluster_or_skip(1) as c:
        shims = ssh(c, "h1", 'echo "${PYENV_ROOT:-$HOME/.pyenv}/shims"')
        ssh(c, "h1", f"set -o noclobber; echo > {shims}/.pyenv-shim")  # the lock, as a rehash takes it
        t0 = time.monotonic()
        assert ssh(c, "h1", "echo up") == "up"
        assert time.monotonic() - t0 < 10  # a rehash would wait 60 s for the lock
        assert not (rc.parent / ".pyenv" / "shims" / ".pyenv-shim").exists()  # the host's, not this machine's


def test_a_cpu_share_holds_every_login_and_what_it_starts() -> None:
    reason = cpu_limits_available()
    if reason:
        pytest.skip(reason)
    with cluster_or_skip(2, cpus_per_host=0.3) as c:
        groups = {}
        for h in c.hosts:
            assert h.cgroup is not None
            # A process started detached (as ucmctl starts servers) still counts against its host.
            line = ssh(c, h.name, "setsid sh -c 'cat /proc/self/cgroup' </dev/null")
            fields = [part.split(":", 2) for part in line.splitlines()]  # id:controllers:path
            groups[h.name] = {path for _, kinds, path in fields if "cpu" in kinds.split(",") or not kinds}
            assert f"/{h.cgroup.name}" in groups[h.name], line
        assert groups["h1"] != groups["h2"]
        quota = c.hosts[0].cgroup / "cpu.cfs_quota_us"
        if quota.exists():  # cgroup v1
            assert quota.read_text().strip() == "30000"
            assert (c.hosts[0].cgroup / "cpu.cfs_period_us").read_text().strip() == "100000"
        else:
            assert (c.hosts[0].cgroup / "cpu.max").read_text().split() == ["30000", "100000"]
        cgroups = [h.cgroup for h in c.hosts]
    assert not any(g.exists() for g in cgroups)  # removed with the hosts
