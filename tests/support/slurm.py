"""A real multi-node Slurm cluster for tests, on the network-namespace hosts of `netns` (needs root).

One slurmctld on this machine and one slurmd per host, inside that host's network namespace and
with its hostname, so job steps run "on" the host as SSH sessions do. Everything is private to the
cluster: its own munged (key and socket in the cluster's folder), its own config (reached through
SLURM_CONF, nothing in /etc), random ports and a random first job id, so a system Slurm or a second
test session on this machine is left alone. Background and measurements: slurm-on-one-machine.md in
the shared docs.
"""

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

from tests.support import netns
from tests.support.processes import alive as _alive

TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "scancel", "squeue", "sinfo", "nsenter")
FREEZER = Path("/sys/fs/cgroup/freezer")
READY_TIMEOUT = 120.0  # one cold start in the doc stalled ~70 s inside slurmctld


def available() -> str | None:
    """Why a Slurm cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "slurmd and network namespaces need root"
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} is missing (scripts/setup.sh installs it)"
    if not FREEZER.is_dir():
        return f"{FREEZER} is missing: proctrack/cgroup needs the cgroup v1 freezer hierarchy"
    return None


def _netns_inode(path: Path | str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 10) -> None:
    """Signal a daemon's process group and reap it; SIGKILL if it ignores `sig` for `grace` s."""
    for s in (sig, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, s)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class Slurm:
    base: Path
    conf: Path
    nodes: list[str]
    env: dict[str, str]
    partition: str = "debug"
    slurmd_port: int = 0
    hosts: netns.Cluster | None = None
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # "slurmctld", node, ...

    @property
    def work(self) -> Path:
        """The cwd of Slurm commands, so that no job depends on where the test runs. (Any folder
        works: jobs submitted from the checkout run too. A job shows RUNNING up to ~2 s before
        its batch script starts, which is what looked like "no processes" in the doc.)"""
        return self.base / "work"

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=self.env, cwd=self.work, capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip

    def _netns_path(self, node: str) -> str:
        assert self.hosts is not None
        return f"/run/netns/{self.hosts.host(node).netns}"

    def _node_state(self, node: str) -> str:
        done = self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T", timeout=10)
        return done.stdout.strip().lower() if done.returncode == 0 else ""

    def start_slurmd(self, node: str, timeout: float = READY_TIMEOUT) -> None:
        """Start the node's slurmd and wait until slurmctld hears from it again (after a loss,
        ReturnToService=2 brings a DOWN node back as soon as it registers)."""
        self._spawn_slurmd(node)
        self._wait_nodes([node], timeout)

    def _spawn_slurmd(self, node: str) -> None:
        old = self.daemons.get(node)
        if old is not None and old.poll() is None:
            raise RuntimeError(f"slurmd on {node} is running")
        boot = f"hostname {node} && exec slurmd -D -f {self.conf} -N {node}"
        log = (self.base / "log" / f"slurmd-{node}.out").open("ab")
        # nsenter --net, not `ip netns exec`: that remounts /sys, which hides the cgroup hierarchy
        self.daemons[node] = subprocess.Popen(
            ["nsenter", f"--net={self._netns_path(node)}", "unshare", "--uts", "sh", "-c", boot],
            env=self.env, cwd=self.work, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()

    def stop_slurmd(self, node: str) -> None:
        """As a lost node: slurmd dies without a word to slurmctld, its job steps live on."""
        proc = self.daemons.pop(node, None)
        if proc is not None:
            _stop(proc, signal.SIGKILL)

    def _listens(self, node: str) -> bool:
        assert self.hosts is not None
        address = (self.hosts.host(node).address, self.slurmd_port)
        with contextlib.suppress(OSError), socket.create_connection(address, timeout=1):
            return True
        return False

    def _wait_nodes(self, nodes: list[str], timeout: float) -> None:
        """Until each slurmd listens and slurmctld counts it as up. A slurmd restarted before
        slurmctld noticed it was gone still shows as up, hence the port."""
        deadline = time.monotonic() + timeout
        while True:
            states = {n: self._node_state(n) if self._listens(n) else "not listening" for n in nodes}
            # "idle", or "mixed"/"allocated" for a node that comes back under a running job
            bad = ("down", "*", "unknown", "drain", "not")
            if all(s and not any(b in s for b in bad) for s in states.values()):
                return
            for n in [*nodes, "slurmctld"]:
                proc = self.daemons.get(n)
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"{'slurmd on ' + n if n in nodes else n} exited ({proc.returncode}): "
                                       f"{_tail(self.base / 'log')}")  # fmt: skip
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Slurm nodes not ready after {timeout} s: {states}: {_tail(self.base / 'log')}"
                )
            time.sleep(0.1)

    def jobs(self) -> list[str]:
        done = self.run("squeue", "-h", "-a", "--states=all", "-o", "%i", timeout=10)
        return done.stdout.split()

    def steps(self) -> list[str]:
        done = self.run("squeue", "-h", "-a", "-s", "-o", "%i", timeout=10)
        return done.stdout.split()

    def job_processes(self) -> list[int]:
        """Live processes of jobs on this cluster's nodes. The cgroups (`slurm_<node>`) are named
        after the node only, so a second cluster with an h1 shares them: a process counts when it
        is also in the node's network namespace."""
        found: set[int] = set()
        for node in self.nodes:
            inode = _netns_inode(self._netns_path(node))
            for procs in _job_cgroup_procs(FREEZER / f"slurm_{node}"):
                with contextlib.suppress(OSError):
                    for pid in map(int, procs.read_text().split()):
                        if _netns_inode(f"/proc/{pid}/ns/net") != inode or not _alive(pid):
                            continue
                        with contextlib.suppress(OSError):
                            if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmstepd":
                                continue
                        found.add(pid)
        return sorted(found)

    def _node_processes(self) -> list[int]:
        """What Slurm runs on the nodes: job processes and slurmstepd, which no cgroup holds."""
        inodes = {_netns_inode(self._netns_path(node)) for node in self.nodes} - {None}
        stepds = set()
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError, ValueError):
                if (proc / "comm").read_text().strip() != "slurmstepd" or not _alive(int(proc.name)):
                    continue
                if _netns_inode(proc / "ns" / "net") in inodes:
                    stepds.add(int(proc.name))
        return sorted(stepds | set(self.job_processes()))


# `gpus=N` makes N of the machine's virtual consoles (/dev/tty10...) each node's "GPUs": Slurm
# needs a device file per GPU to count, allocate and number them (CUDA_VISIBLE_DEVICES); nothing
# opens them.
FAKE_GPU_TTY = 10


def _config(base: Path, hosts: list[netns.Host], subnet: str, ctld_port: int, gpus: int = 0) -> str:
    """slurm.conf. Timeouts are short so a lost node shows quickly (MessageTimeout bounds how long
    srun tries a dead slurmd: ~3 s at 2, ~6 s at 5) and a cancelled job is gone fast; CPUs=2 per
    node so steps of one allocation can overlap; batch_sched_delay=0 starts an sbatch job within
    ~1 s instead of ~3 s."""
    tag = base.name.rsplit("-", 1)[-1]
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    nodes = "".join(f"NodeName={h.name} NodeHostname={h.name} NodeAddr={h.address} CPUs=2 "
                    f"RealMemory=4000{gres} State=UNKNOWN\n" for h in hosts)  # fmt: skip
    return f"""\
{"GresTypes=gpu" if gpus else ""}
ClusterName=ucm{tag}
SlurmctldHost={socket.gethostname()}({subnet}.1)
SlurmctldPort={ctld_port}
SlurmdPort={ctld_port + 1}
FirstJobId={random.randrange(1, 1000) * 10000}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={base}/munge.socket
CredType=cred/munge
StateSaveLocation={base}/ctld
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=10
MessageTimeout=2
KillWait=2
MinJobAge=5
SchedulerParameters=batch_sched_delay=0
{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


CGROUP_CONF = """\
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
"""


def _oci_conf(base: Path) -> str:
    """oci.conf (beside slurm.conf) for runc as root: one container per task, named by Slurm's
    pattern (node, user, job, step, task), its state under the cluster's folder."""
    runc, name = f"runc --root={base}/runc", "%n.%u.%j.%s.%t"
    commands = {"Query": f"state {name}", "Kill": f"kill -a {name}", "Delete": f"delete --force {name}",
                "Run": f"run {name} -b %b"}  # fmt: skip
    return "".join(f'RunTime{key}="{runc} {what}"\n' for key, what in commands.items())


def runc_containers(s: Slurm) -> list[str]:
    """The runc containers of the cluster's OCI steps that still exist (running or stopped)."""
    if not (s.base / "runc").exists():
        return []
    argv = ["runc", f"--root={s.base}/runc", "list", "--quiet"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return done.stdout.split()


def _daemon(s: Slurm, name: str, argv: list[str]) -> None:
    """In the foreground, as a child of this process, so that it is reaped here."""
    log = (s.base / "log" / f"{name}.out").open("ab")
    s.daemons[name] = subprocess.Popen(argv, env=s.env, cwd=s.work, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    log.close()


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear; see {path.parent}/log")
        time.sleep(0.02)


@contextlib.contextmanager
def slurm_cluster(
    hosts: netns.Cluster, nodes: list[str] | None = None, gpus: int = 0, oci: bool = False
) -> Iterator[Slurm]:
    """slurmd on `nodes` (default: every host), ready when every node is idle. With `oci`, Slurm's
    own container support (`srun --container BUNDLE`) runs steps with runc (its state in the
    cluster's folder; a container's cgroups are made inside the step's)."""
    chosen = [hosts.host(n) for n in nodes] if nodes is not None else list(hosts.hosts)
    base = hosts.base / f"slurm-{uuid.uuid4().hex[:6]}"
    for sub in ("ctld", "log", "run", "work", *(f"spool/{h.name}" for h in chosen)):
        (base / sub).mkdir(parents=True)
    conf = base / "slurm.conf"
    ctld_port = _free_pair()  # and the next one for slurmd
    conf.write_text(_config(base, chosen, hosts.subnet, ctld_port, gpus))
    if gpus:  # a stand-in for GPUs (there are none here): Slurm counts and binds these devices
        (base / "gres.conf").write_text(f"Name=gpu File=/dev/tty[{FAKE_GPU_TTY}-{FAKE_GPU_TTY + gpus - 1}]\n")
    (base / "cgroup.conf").write_text(CGROUP_CONF)
    if oci:
        (base / "oci.conf").write_text(_oci_conf(base))
    key = base / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    s = Slurm(base=base, conf=conf, nodes=[h.name for h in chosen], env=env, hosts=hosts,
              slurmd_port=ctld_port + 1)  # fmt: skip
    try:
        _daemon(s, "munged", ["munged", "-F", "--force", f"--socket={base}/munge.socket", f"--key-file={key}",
                              f"--pid-file={base}/run/munged.pid", f"--log-file={base}/log/munged.log",
                              f"--seed-file={base}/munge.seed"])  # fmt: skip
        _wait_for(base / "munge.socket", s.daemons["munged"])
        _daemon(s, "slurmctld", ["slurmctld", "-D", "-f", str(conf)])
        for node in s.nodes:
            s._spawn_slurmd(node)
        s._wait_nodes(s.nodes, READY_TIMEOUT)
        yield s
    finally:
        _teardown(s)


def _free_pair() -> int:
    """An even port free on this machine (slurmctld's, below the kernel's ephemeral range where a
    random pick could meet an outgoing connection's port), the next one for the slurmds."""
    for _ in range(200):
        port = random.randrange(20000, 32000, 2)
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("0.0.0.0", port))
                b.bind(("0.0.0.0", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of ports for Slurm between 20000 and 32000")


def _tail(folder: Path, lines: int = 8) -> str:
    """The last lines of each daemon's log in `folder`, to say why Slurm did not come up."""
    parts = []
    for log in sorted(folder.glob("*.log")) if folder.is_dir() else []:
        said = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"{log.name}: " + " | ".join(said))
    return "; ".join(parts) or f"no log in {folder}"


def _teardown(s: Slurm) -> None:
    """Leaves no process of the cluster, whatever state a test left it in (jobs running, daemons
    dead): cancel, then kill what is left in the nodes' namespaces, then stop the daemons."""
    if all(name in s.daemons and s.daemons[name].poll() is None for name in ("slurmctld", "munged")):
        with contextlib.suppress(subprocess.TimeoutExpired):
            jobs = s.jobs()
            if jobs and s.run("scancel", *jobs, timeout=10).returncode == 0:  # else nothing to wait for
                deadline = time.monotonic() + 10
                while s._node_processes() and time.monotonic() < deadline:
                    time.sleep(0.05)
    _kill(s._node_processes())  # slurmstepd of a lost node, or a step that would not die
    # SIGKILL: slurmctld takes ~3 s to save state on SIGTERM, and the state is deleted below
    for name in [n for n in s.daemons if n in s.nodes] + ["slurmctld", "munged"]:
        proc = s.daemons.pop(name, None)
        if proc is not None:
            _stop(proc, signal.SIGTERM if name == "munged" else signal.SIGKILL)
    _kill(s._node_processes())  # started by a slurmd in its last moments
    for container in runc_containers(s):  # of a step that was killed before Slurm deleted it
        subprocess.run(["runc", f"--root={s.base}/runc", "delete", "--force", container], capture_output=True,
                       check=False)  # fmt: skip
    _remove_cgroups(s)
    shutil.rmtree(s.base, ignore_errors=True)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _remove_cgroups(s: Slurm) -> None:
    """The nodes' cgroups, deepest first. Ones still in use (a second cluster's h1 shares
    `slurm_h1`) refuse rmdir and stay."""
    deadline = time.monotonic() + 5
    for node in s.nodes:
        top = FREEZER / f"slurm_{node}"
        for d in sorted(top.glob("**/"), key=lambda p: -len(p.parts)):
            while True:  # killed processes leave their cgroup a moment after SIGKILL
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if not (d / "cgroup.procs").exists() or time.monotonic() > deadline:
                        break
                    if any(_alive(int(p)) for p in (d / "cgroup.procs").read_text().split()):
                        break
                    time.sleep(0.05)


@dataclass
class Site:
    """A Slurm cluster and the test hosts it runs on."""

    hosts: netns.Cluster
    slurm: Slurm


@contextlib.contextmanager
def slurm_or_skip(
    hosts: netns.Cluster, nodes: list[str] | None = None, gpus: int = 0, oci: bool = False
) -> Iterator[Slurm]:
    """`slurm_cluster(...)` for a test, which is skipped where Slurm (or, with `oci`, runc) cannot run."""
    import pytest

    reason = available() or (None if not oci or shutil.which("runc") else "runc is missing")
    if reason:
        pytest.skip(f"needs a Slurm cluster: {reason}")
    with slurm_cluster(hosts, nodes, gpus, oci) as s:
        yield s


def _job_cgroup_procs(node: Path) -> list[Path]:
    """The `cgroup.procs` of every job's cgroups on a node (`uid_*/job_*/...`). Walked with
    os.walk, which skips a folder that goes while it walks (scancel removes the job's cgroups),
    where Path.glob raises FileNotFoundError."""
    found = []
    for folder, _, files in os.walk(node):
        parts = Path(folder).relative_to(node).parts
        in_a_job = len(parts) >= 2 and parts[0].startswith("uid_") and parts[1].startswith("job_")
        if in_a_job and "cgroup.procs" in files:
            found.append(Path(folder) / "cgroup.procs")
    return found
