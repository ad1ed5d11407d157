"""The test Slurm cluster itself: its steps must run on the netns hosts (their hostname and network
namespace), scancel must end every process of a job, a lost slurmd must show as a failing step, and
nothing of the cluster may outlive it, or the Slurm launcher tests measure the wrong thing."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.netns import Cluster, cluster_or_skip
from tests.support.slurm import Slurm, slurm_or_skip

pytestmark = [pytest.mark.root]


def allocate(s: Slurm) -> str:
    """A running two-node allocation, as the launcher makes one."""
    job = s.run(
        "sbatch", "--parsable", "-N2", "-w", "h1,h2", "-o", "/dev/null", "--wrap", "exec sleep infinity"
    )
    assert job.returncode == 0, job.stderr
    jid = job.stdout.strip()
    deadline = time.monotonic() + 30
    while s.run("squeue", "-h", "-j", jid, "-o", "%T").stdout.strip() != "RUNNING":
        assert time.monotonic() < deadline, s.run("squeue").stdout
        time.sleep(0.1)
    return jid


def overlap(s: Slurm, jid: str, node: str, *command: str) -> subprocess.CompletedProcess[str]:
    return s.run("srun", f"--jobid={jid}", "--overlap", "-w", node, "-N1", "-n1", *command)


def netns_inode(path: str) -> int:
    return os.stat(path).st_ino


def processes_of(c: Cluster, base: Path, daemons: list[int]) -> list[str]:
    """Live processes of a Slurm cluster: one it started, one naming its folder, or one in its
    hosts' network namespaces other than their sshd (slurmstepd and job processes name neither)."""
    inodes = {netns_inode(f"/run/netns/{h.netns}") for h in c.hosts}
    sshd = {h.sshd.pid for h in c.hosts if h.sshd is not None}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in (os.getpid(), *sshd):
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            inode = os.stat(proc / "ns" / "net").st_ino
        except OSError:
            continue
        if int(proc.name) in daemons or str(base) in cmdline or inode in inodes:
            found.append(f"{proc.name}: {cmdline}")
    return found


def test_steps_run_on_the_hosts() -> None:
    with cluster_or_skip(2) as c, slurm_or_skip(c) as s:
        assert s.nodes == ["h1", "h2"] and s.partition == "debug"
        done = s.run("srun", "-N2", "hostname")
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.split()) == ["h1", "h2"]


@pytest.mark.slow
def test_a_step_lives_in_its_hosts_namespace_and_scancel_ends_all_of_it() -> None:
    with cluster_or_skip(2) as c:
        with slurm_or_skip(c) as s:
            jid = allocate(s)
            assert s.jobs() == [jid]
            # a step as the launcher starts a server: a child of its shell, and an orphan in a new session
            step = subprocess.Popen(
                ["srun", f"--jobid={jid}", "--overlap", "-w", "h1", "-N1", "-n1",
                 "sh", "-c", "setsid -f sleep 300; exec sleep 301"],
                env=s.env, cwd=s.work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            deadline = time.monotonic() + 15
            while len(s.steps()) < 2 or not any(sleeper(pid) == "301" for pid in s.job_processes()):
                assert time.monotonic() < deadline, (s.steps(), s.job_processes())
                time.sleep(0.1)
            h1 = netns_inode(f"/run/netns/{c.host('h1').netns}")
            on_h1 = {
                pid: sleeper(pid) for pid in s.job_processes() if netns_inode(f"/proc/{pid}/ns/net") == h1
            }
            assert {"300", "301"} <= set(on_h1.values()), on_h1
            assert netns_inode("/proc/self/ns/net") != h1

            start = time.monotonic()
            assert s.run("scancel", jid).returncode == 0
            while s.job_processes():
                assert time.monotonic() - start < 5, s.job_processes()
                time.sleep(0.02)
            print(f"scancel to no job process: {time.monotonic() - start:.2f} s")
            step.wait(timeout=30)

            left = allocate(s)  # left running: the cluster must end it
            base, daemons = s.base, [p.pid for p in s.daemons.values()]
        assert processes_of(c, base, daemons) == []
        assert not base.exists()
        freezer = Path("/sys/fs/cgroup/freezer")
        assert not [d for j in (jid, left) for d in freezer.glob(f"slurm_h[12]/uid_*/job_{j}")]


def sleeper(pid: int) -> str:
    """The argument of a `sleep` process, else ""."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    return argv[1].decode() if argv[0] == b"sleep" else ""


@pytest.mark.slow
def test_a_lost_slurmd_fails_steps_on_its_node_until_it_is_back() -> None:
    with cluster_or_skip(2) as c:
        with slurm_or_skip(c) as s:
            jid = allocate(s)
            assert overlap(s, jid, "h2", "true").returncode == 0

            s.stop_slurmd("h2")
            start = time.monotonic()
            lost = overlap(s, jid, "h2", "true")
            print(f"step on a lost node failed after {time.monotonic() - start:.2f} s: {lost.stderr!r}")
            assert lost.returncode != 0
            assert time.monotonic() - start < 15
            assert overlap(s, jid, "h1", "true").returncode == 0

            start = time.monotonic()
            s.start_slurmd("h2")
            print(f"slurmd on h2 back after {time.monotonic() - start:.2f} s")
            back = overlap(s, jid, "h2", "hostname")
            assert (back.returncode, back.stdout.strip()) == (0, "h2"), back.stderr

            overlap(s, jid, "h2", "true")
            s.stop_slurmd("h2")  # the cluster ends with a dead slurmd and a job on its node
            base, daemons = s.base, [p.pid for p in s.daemons.values()]
        assert processes_of(c, base, daemons) == []
