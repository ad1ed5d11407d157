"""Slurm: one allocation holds the deployment's nodes; each process is a job step on its node.

`up` submits a holder job (`sbatch --wrap 'exec sleep infinity'`, named `ucmctl-<deployment>`)
for exactly the plan's nodes and waits until it runs. Every command on a node (preflight,
staging, node locks, looks at pidfiles, stopping) is a short step `srun --jobid J --overlap -w
NODE`; every process is a long step whose task is the process itself (`setsid -w`), so it
lives in the job's cgroup and Slurm takes it back with the job. `down` stops the processes
(TERM, grace, KILL, as on SSH), then cancels the job and waits until Slurm lists it no more.
The job's name finds it again when the local record is lost."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence

from rich.console import Console

from ucmctl.core.errors import ExitStatus
from ucmctl.core.words import counted
from ucmctl.launch.base import Allocation, Launcher, LaunchError, LaunchOptions
from ucmctl.nodes import lifecycle
from ucmctl.nodes.executor import Executor, LocalExecutor, NodeError, Result
from ucmctl.plan.model import NodePlan, Plan, Process, SlurmPlan
from ucmctl.topology.model import Topology

# What a step takes from this machine's environment (as an SSH login would have its own).
STEP_ENVIRONMENT = "PATH,HOME,USER,LOGNAME,LANG,LC_ALL,TZ"
# Slurm's commands run from a folder every node has: a job inherits the submitter's folder.
NEUTRAL_DIR = "/tmp"
PIDFILE_WITHIN_S = 60.0  # a step started: how long its pidfile may take to appear
_SRUN_ERROR = re.compile(r"^srun: error: (.*)$", re.MULTILINE)
_NODE_ADDR = re.compile(r"NodeName=(\S+).*?NodeAddr=(\S+)", re.DOTALL)
_TASK_EXIT = re.compile(r"task \d+: (Exited with exit code|Killed|Terminated)", re.IGNORECASE)
_GONE = (
    "",
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
)


class SlurmError(LaunchError):
    """A Slurm command failed or refused; the message carries Slurm's own line."""


def slurm(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command; its failure to run at all is a SlurmError."""
    try:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=NEUTRAL_DIR,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise SlurmError(f"`{argv[0]}` is not installed on this machine") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{argv[0]}` did not answer within {timeout:.0f} s") from None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def srun_refusal(stderr: str) -> str | None:
    """srun's own error (the step could not run), not the command's exit status, which srun
    reports as an error line too ("task 0: Exited with exit code 1")."""
    errors = [e.strip() for e in _SRUN_ERROR.findall(stderr) if not _TASK_EXIT.search(e)]
    return errors[0] if errors else None


def _where(spec: SlurmPlan, time_limit: str | None = None) -> list[tuple[str, str]]:
    """Where a job may run and for how long, as (flag, value) pairs."""
    flags = [
        ("partition", spec.partition),
        ("account", spec.account),
        ("qos", spec.qos),
        ("time", time_limit or spec.time_limit),
    ]
    return [(flag, value) for flag, value in flags if value]


def _placement(spec: SlurmPlan | None, time_limit: str | None = None) -> list[str]:
    """sbatch/srun flags that say where a job may run and for how long."""
    return [] if spec is None else [f"--{flag}={value}" for flag, value in _where(spec, time_limit)]


def slurm_spec(plan: Plan) -> SlurmPlan:
    """The Slurm allocation a plan of a Slurm cluster asks for."""
    assert isinstance(plan.cluster, SlurmPlan), f"{plan.deployment} runs on {plan.cluster.kind}, not Slurm"
    return plan.cluster


def allocation_flags(plan: Plan) -> list[tuple[str, str | bool]]:
    """The allocation's sbatch flags, for `up` and for `render --slurm` alike: one job named
    after the deployment, its nodes (named, unless Slurm chooses them) whole, one task each,
    the GRES its busiest node uses, where and for how long. (flag, value); True: no value."""
    spec = slurm_spec(plan)
    flags: list[tuple[str, str | bool]] = [
        ("job-name", spec.job_name(plan.deployment)),
        ("nodes", str(len(plan.nodes))),
    ]
    if not spec.choose_nodes:
        flags.append(("nodelist", ",".join(plan.nodes)))
    flags += [("ntasks-per-node", "1"), ("exclusive", True)]
    gres = spec.gres_per_node(plan)
    if gres:
        flags.append(("gres", gres))
    return flags + list(_where(spec))


def container_options(process: Process) -> list[str]:
    """What a job step's srun adds to run the process in its image (pyxis) or OCI bundle, if any."""
    c = process.container
    return list(c.argv) if c is not None and c.runtime in ("pyxis", "oci") else []


class StepExecutor(LocalExecutor):
    """A node of a running allocation: each command is a job step on it (`srun --overlap`, so
    it shares the node with the processes). A step Slurm cannot start is a NodeError."""

    def __init__(
        self, node: NodePlan, job_id: str | None, spec: SlurmPlan | None = None, gres: str | None = None
    ) -> None:
        super().__init__(node)
        self.job_id = job_id
        # Without a job: each command is a small job of its own (purge, install after `down`).
        self.alone = [] if job_id else _placement(spec, time_limit="10")
        # Every step sees the job's accelerators (with ConstrainDevices, a step sees only its own
        # GRES); the steps overlap, so they share them, and each process picks its own by index.
        self.gres = [f"--gres={gres}"] if gres and job_id else []

    def argv(self, command: str, *, name: str = "ucmctl-command", container: Sequence[str] = ()) -> list[str]:
        """srun of one task on the node running `command`; `container`: pyxis's or Slurm's
        container options (the step runs in the image)."""
        within = [f"--jobid={self.job_id}", "--overlap", *self.gres] if self.job_id else self.alone
        # Only these of this machine's environment reach the node (Slurm would pass all of it, the
        # secrets of whoever runs ucmctl included); the launch script sets the process's own.
        where = self.node.slurm_node or self.node.name
        return [
            "srun",
            *within,
            f"--nodelist={where}",
            "--nodes=1",
            "--ntasks=1",
            "--quiet",
            f"--export={STEP_ENVIRONMENT}",
            f"--job-name={name}",
            *container,
            "/bin/sh",
            "-c",
            command,
        ]

    def run_in(self, command: str, container: Sequence[str], *, timeout: float = 60) -> Result:
        """`command` on the node in a container: a step with srun's container options."""
        argv = self.argv(command, container=container)
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=NEUTRAL_DIR,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise NodeError(self.node.name, f"command timed out after {timeout:.0f} s") from None
        return Result(command, done.returncode, done.stdout, done.stderr)

    def run(self, command: str, *, timeout: float = 60) -> Result:
        try:
            done = super().run(command, timeout=timeout)
        except FileNotFoundError:
            raise NodeError(self.node.name, "`srun` is not installed on this machine") from None
        refused = srun_refusal(done.stderr)
        if refused and done.exit_code != 0:
            raise NodeError(self.node.name, f"Slurm could not run a step there: {refused}")
        return done

    def put(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        data = content.encode() if isinstance(content, str) else content
        q, tmp = shlex.quote(path), shlex.quote(f"{path}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        script = (
            f"mkdir -p {shlex.quote(os.path.dirname(path))} && cat > {tmp} && chmod {mode:o} {tmp} "
            f"&& mv -f {tmp} {q}"
        )
        done = subprocess.run(self.argv(script), input=data, capture_output=True, timeout=60, cwd=NEUTRAL_DIR)
        if done.returncode != 0:
            raise NodeError(self.node.name, f"cannot write {path}: {_last_line(done.stderr.decode())}")


class SlurmLauncher(Launcher):
    kind = "slurm"

    def __init__(
        self, plan: Plan, allocation: Allocation | None = None, options: LaunchOptions | None = None
    ) -> None:
        super().__init__(plan, allocation, options)
        self.spec = slurm_spec(plan)
        self._allocation = allocation
        self._steps: list[subprocess.Popen[bytes]] = []
        self._bound: dict[str, str] = allocation.nodes if allocation is not None else {}

    # -- the allocation ----------------------------------------------------------------------

    @property
    def allocation(self) -> Allocation | None:
        return self._allocation

    @property
    def job_name(self) -> str:
        return self.spec.job_name(self.plan.deployment)

    def job_id(self) -> str | None:
        """The allocation's job id: the recorded one, else the one Slurm lists under the job's
        name for this user (a record lost, or an `up` killed before it read the id back)."""
        if self._allocation is not None and self._allocation.job_id:
            return self._allocation.job_id
        found = self.jobs()
        return found[0] if found else None

    def jobs(self) -> list[str]:
        """Ids of this deployment's jobs Slurm still holds (pending, running, completing), oldest first."""
        listed = slurm("squeue", "--me", "--noheader", f"--name={self.job_name}", "--format=%i")
        if listed.returncode != 0:
            raise SlurmError(f"squeue failed: {_last_line(listed.stderr)}")
        return sorted(listed.stdout.split(), key=lambda j: int(j) if j.isdigit() else 0)

    def state(self, job_id: str) -> tuple[str, str]:
        """(state, reason) of a job as squeue lists it; ("", "") once Slurm no longer lists it."""
        listed = slurm("squeue", "--noheader", f"--jobs={job_id}", "--format=%T|%r")
        if listed.returncode != 0:  # "Invalid job id specified": gone from the controller
            return "", ""
        state, _, reason = listed.stdout.strip().partition("|")
        return state, reason

    def preflight(self) -> list[str]:
        for tool in ("sbatch", "srun", "squeue", "scancel", "sinfo"):
            if shutil.which(tool) is None:
                return [
                    f"Slurm: `{tool}` is not on this machine's PATH: run `ucmctl up` on a machine "
                    "that can submit jobs (a login node), or use `cluster: {kind: ssh}`"
                ]
        problems = []
        if self.spec.partition:
            shown = slurm("sinfo", "--noheader", f"--partition={self.spec.partition}", "--format=%P")
            if shown.returncode != 0 or not shown.stdout.strip():
                problems.append(
                    f"Slurm: partition '{self.spec.partition}' does not exist "
                    "(`sinfo -s` lists them): fix cluster.partition"
                )
        if self.spec.choose_nodes:
            return problems  # Slurm picks them: no name to check
        names = ",".join(self.plan.nodes)
        shown = slurm("sinfo", "--noheader", "--Node", f"--nodes={names}", "--format=%N")
        known = set(shown.stdout.split()) if shown.returncode == 0 else set()
        for node in self.plan.nodes:
            if node not in known:
                problems.append(
                    f"node {node}: Slurm knows no node of that name (`sinfo -N` lists them): "
                    "name nodes as Slurm does"
                )
        return problems

    def acquire(
        self, console: Console, on_submitted: Callable[[Allocation], None], *, wait: float | None = None
    ) -> None:
        running = self.jobs()
        if running:
            fix = f"run `ucmctl down {self.plan.deployment}` first"
            raise SlurmError(
                f"Slurm already runs job {', '.join(running)} named {self.job_name}: {fix}",
                ExitStatus.NOT_READY,
            )
        self._allocation = Allocation(kind="slurm", job_name=self.job_name)
        on_submitted(self._allocation)  # recorded before sbatch: a crash after it leaves a trace
        # The holder only sleeps: it takes none of this machine's environment (--export=NONE).
        argv = ["sbatch", "--parsable"]
        argv += [
            f"--{flag}" if value is True else f"--{flag}={value}"
            for flag, value in allocation_flags(self.plan)
        ]
        argv += [f"--chdir={NEUTRAL_DIR}", "--output=/dev/null", "--error=/dev/null", "--export=NONE"]
        console.print(
            f"Slurm: submitting {self.job_name} for {counted(len(self.plan.nodes), 'node')} ...", markup=False
        )
        submitted = slurm(*argv, "--wrap=exec sleep infinity")
        if submitted.returncode != 0:
            raise SlurmError(f"sbatch refused the allocation: {_last_line(submitted.stderr)}")
        job_id = submitted.stdout.strip().split(";")[0]
        self._allocation = Allocation(kind="slurm", job_name=self.job_name, job_id=job_id)
        on_submitted(self._allocation)
        self._wait_running(job_id, console, self.spec.wait_allocation if wait is None else wait)
        if self.spec.choose_nodes:
            self._allocation = self._allocation.model_copy(update={"nodes": self._binding(job_id)})
            on_submitted(self._allocation)

    def _wait_running(self, job_id: str, console: Console, wait: float) -> None:
        deadline = time.monotonic() + wait
        said = ""
        while True:
            state, reason = self.state(job_id)
            if state == "RUNNING":
                console.print(
                    f"Slurm: job {job_id} runs on {', '.join(self._job_nodes(job_id))}", markup=False
                )
                return
            if state in _GONE:
                raise SlurmError(
                    f"Slurm job {job_id} ended before it ran ({state or 'gone'}"
                    f"{', ' + reason if reason and reason != 'None' else ''})"
                )
            if state == "PENDING" and reason != said and reason != "None":
                console.print(f"Slurm: job {job_id} pending ({reason})", markup=False)
                said = reason
            if time.monotonic() > deadline:
                self.release()
                raise SlurmError(
                    f"Slurm job {job_id} still {state.lower()} after {wait:g} s ({reason}); cancelled it"
                )
            time.sleep(0.2)

    def _job_nodes(self, job_id: str) -> list[str]:
        """The nodes of a running job, in Slurm's order."""
        listed = slurm("squeue", "--noheader", f"--jobs={job_id}", "--format=%N")
        expanded = slurm("scontrol", "show", "hostnames", listed.stdout.strip())
        return expanded.stdout.split()

    def _binding(self, job_id: str) -> dict[str, str]:
        """Plan node -> Slurm node for a job Slurm placed: names in order, both sides sorted, so
        the same job always binds the same way (a `down` without the record finds them)."""
        got = sorted(self._job_nodes(job_id))
        if len(got) != len(self.plan.nodes):
            raise SlurmError(
                f"Slurm job {job_id} holds {len(got)} nodes ({', '.join(got)}), "
                f"the plan needs {len(self.plan.nodes)}"
            )
        return dict(zip(sorted(self.plan.nodes), got, strict=True))

    def bind(self, topology: Topology) -> Plan | None:
        if not self.spec.choose_nodes or self._allocation is None:
            return None
        from ucmctl.plan.build import build_plan

        shown = slurm("scontrol", "show", "node", ",".join(self._allocation.nodes.values()))
        address = dict(_NODE_ADDR.findall(shown.stdout))
        missing = [n for n in self._allocation.nodes.values() if n not in address]
        if missing:
            raise SlurmError(f"Slurm did not say the address of node {', '.join(missing)}")
        self.plan = build_plan(
            topology, {name: (node, address[node]) for name, node in self._allocation.nodes.items()}
        )
        self.spec = slurm_spec(self.plan)
        return self.plan

    def release(self) -> bool:
        """Cancel the allocation (every job of the deployment's name) and wait until Slurm lists
        none of them: then every step and every process in them is gone."""
        jobs = set(self.jobs())
        if self._allocation is not None and self._allocation.job_id:
            jobs.add(self._allocation.job_id)
        for job in sorted(jobs):
            slurm("scancel", job)
        deadline = time.monotonic() + 60
        while jobs and time.monotonic() < deadline:
            jobs = {j for j in jobs if self.state(j)[0] not in _GONE}
            if jobs:
                time.sleep(0.2)
        self._reap()
        return not jobs

    def view(self) -> list[str]:
        job = self.job_id()
        if job is None:
            return [f"Slurm: no job named {self.job_name}: its processes are gone"]
        state, reason = self.state(job)
        lines = [
            f"Slurm job {job} ({self.job_name}): {state.lower() or 'gone'}"
            + (f" ({reason})" if reason and reason != "None" else "")
        ]
        nodes = ",".join(self.plan.nodes)
        shown = slurm("sinfo", "--noheader", "--Node", f"--nodes={nodes}", "--format=%N %T")
        for line in shown.stdout.splitlines():
            node, _, node_state = line.partition(" ")
            if node_state.endswith("*") or node_state.startswith(("down", "drain", "fail")):
                lines.append(f"node {node}: {node_state} (slurmd not responding: its processes may be lost)")
        return lines

    # -- nodes and processes -----------------------------------------------------------------

    def _open(self, node: str) -> Executor:
        job = self.job_id()
        if job is None:
            raise NodeError(node, f"no Slurm job named {self.job_name} runs")
        plan_node = self.plan.nodes[node]
        if self.spec.choose_nodes and plan_node.slurm_node is None:  # a plan from the topology alone
            if not self._bound:
                self._bound = self._binding(job)
            plan_node = plan_node.model_copy(update={"slurm_node": self._bound[node]})
        return StepExecutor(plan_node, job, gres=self.spec.gres_per_node(self.plan))

    def standalone(self, node: str) -> Executor:
        return StepExecutor(self.plan.nodes[node], None, self.spec)

    def start(self, process: Process) -> lifecycle.Started:
        """The process as a step of its own, its srun left attached on this machine (in a session
        of its own, so neither Ctrl-C nor the end of `up` reaches it); then its pidfile."""
        ex = self[process.node]
        assert isinstance(ex, StepExecutor)
        argv = ex.argv(
            lifecycle.spawn(process, foreground=True), name=process.name, container=container_options(process)
        )
        pidfile = shlex.quote(process.pidfile)
        # srun's own errors go to a file: srun outlives this command, a pipe would break under it.
        with tempfile.TemporaryFile() as said:
            step = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=said,
                cwd=NEUTRAL_DIR,
                start_new_session=True,
            )
            self._steps.append(step)
            deadline, last = time.monotonic() + PIDFILE_WITHIN_S, ""
            while time.monotonic() < deadline:
                if step.poll() is not None:
                    said.seek(0)
                    why = _last_line(said.read().decode(errors="replace"))
                    raise NodeError(
                        process.node,
                        f"could not start {process.name}: its step ended at once"
                        + (f" ({why})" if why else ""),
                    )
                try:
                    done = ex.run(f"cat {pidfile} 2>/dev/null", timeout=30)
                except NodeError as exc:  # the look is a step of its own, which a loaded
                    last = f" ({exc.reason})"  # controller may start late (seen in CI: 30 s)
                else:
                    if done.stdout.strip().isdigit():
                        return lifecycle.Started(int(done.stdout.strip()))
                time.sleep(0.1)
        raise NodeError(
            process.node, f"could not start {process.name}: no pidfile after {PIDFILE_WITHIN_S:.0f} s{last}"
        )

    def stop(self, process: Process, *, grace: float) -> lifecycle.Stopped:
        try:
            return super().stop(process, grace=grace)
        except NodeError:
            job = self.job_id()
            if job is None or self.state(job)[0] in _GONE:  # Slurm took the job back with everything in it
                return lifecycle.Stopped(was_running=False, killed=False)
            raise

    def _reap(self) -> None:
        for step in self._steps:
            with contextlib.suppress(subprocess.TimeoutExpired):
                step.wait(timeout=5)
