"""`up` and `down` as functions: what the CLI and the benchmark suites call."""

from __future__ import annotations

import contextlib
import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ucmctl.core.errors import ExitStatus, Problem, UcmctlError
from ucmctl.core.words import counted
from ucmctl.deploy import kv_probe
from ucmctl.deploy.change import apply, diff
from ucmctl.deploy.guard import node_guard
from ucmctl.deploy.preflight import Preflight, preflight
from ucmctl.deploy.progress import Progress
from ucmctl.deploy.proxy_client import Drain
from ucmctl.deploy.staging import stage_node
from ucmctl.deploy.starting import start_gated
from ucmctl.deploy.state import ProcessState, Record, StateStore, Status
from ucmctl.launch import Allocation, Launcher, LaunchError, launcher_for
from ucmctl.nodes import lifecycle
from ucmctl.nodes.executor import NodeError
from ucmctl.nodes.fanout import cancelled, parallel
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan, Process
from ucmctl.topology.model import Topology  # `up` takes a topology and plans it


@dataclass
class Options:
    keep_on_failure: bool = False
    skip_preflight: bool = False
    connect_timeout: float = 10.0
    stop_grace: float = 15.0
    health_timeout: float | None = None  # overrides every process.health_timeout
    kv_probe: bool = True  # after the health gate, prove KV reaches decode (deploy/kv_probe.py)
    accept_new_host_keys: bool = False  # record unknown SSH host keys instead of refusing them
    wait_allocation: float | None = None  # Slurm: overrides the topology's cluster.wait_allocation
    # of a server taken out or restarted by an `up` of a changed topology
    drain: Drain = field(default_factory=Drain)


def deploy_up(
    topology: Topology,
    topology_path: str,
    *,
    options: Options | None = None,
    console: Console | None = None,
    store: StateStore | None = None,
) -> Record:
    """Preflight, stage, start stage by stage with health gates; on failure stop what started.

    One `up` (or `down`) of a deployment at a time: this machine's lock is taken before
    anything else, then the nodes' (deploy/guard.py), then the nodes are checked."""
    options = options or Options()
    console = console or Console(stderr=True, emoji=False)
    store = store or StateStore()
    plan = build_plan(topology)
    with store.lock(plan.deployment, "up"):
        existing = store.load(plan.deployment)
        if existing is not None and existing.status is Status.up:
            return _change_running(existing, plan, topology_path, options, console, store)
        launcher = launcher_for(
            plan, connect_timeout=options.connect_timeout, accept_new_host_keys=options.accept_new_host_keys
        )
        try:
            _refuse_if_running(store.load(plan.deployment), options)
            try:
                _acquire(launcher, topology_path, store, console, options.wait_allocation)
                plan = launcher.bind(topology) or plan  # Slurm chose the nodes: the plan names them now
                with node_guard(plan, launcher.all()):
                    checked = _preflight(plan, launcher, options, console)
                    return _stage_and_start(topology_path, plan, launcher, checked, options, console, store)
            except BaseException:
                held = launcher.allocation is not None  # and nothing started: nothing left queued
                if held and not _started_any(store.load(plan.deployment)):  # else the record answers
                    _give_back(launcher, store, console)
                raise
        finally:
            launcher.close()


def _started_any(record: Record | None) -> bool:
    return record is not None and any(p.pgid is not None for p in record.processes.values())


def _acquire(
    launcher: Launcher, topology_path: str, store: StateStore, console: Console, wait: float | None
) -> None:
    """The launcher's own checks (exit 3, nothing submitted), then what the processes run in
    (Slurm: the allocation), recorded before the scheduler is asked."""
    plan = launcher.plan
    problems = launcher.preflight()
    if problems:
        raise UcmctlError([Problem(p) for p in problems], status=ExitStatus.NOT_READY)

    def record(allocation: Allocation) -> None:
        digest = plan.topology_digest
        store.save(
            Record(
                deployment=plan.deployment,
                topology_path=topology_path,
                topology_digest=digest,
                plan=plan,
                allocation=allocation,
            )
        )

    launcher.acquire(console, record, wait=wait)


def _give_back(launcher: Launcher, store: StateStore, console: Console) -> bool:
    """Release what the launcher holds; the record goes only once nothing of it is left."""
    try:
        released = launcher.release()
    except LaunchError as exc:
        console.print(f"could not release the allocation: {exc}", markup=False)
        released = False
    if released:
        store.remove(launcher.plan.deployment)
    else:
        console.print(
            f"the allocation is still listed: `ucmctl down {launcher.plan.deployment}` cancels it",
            markup=False,
        )
    return released


def _change_running(
    record: Record, plan: Plan, topology_path: str, options: Options, console: Console, store: StateStore
) -> Record:
    """`up` of a deployment that is up: nothing to do for the topology it runs; for an edited one,
    what is missing is started and what is gone is stopped, the rest left running
    (deploy/change.py). Refused while a process of it is not running (exit 2)."""
    name = record.deployment
    if record.allocation is not None:
        raise UcmctlError.one(
            f"deployment '{name}' is already up: a Slurm deployment is not changed from its "
            "topology while it runs yet",
            fix=f"`ucmctl scale {name}`, or `ucmctl down {name}` first",
        )
    earlier = launcher_for(record.plan, connect_timeout=options.connect_timeout)
    try:
        alive = parallel(record.plan.processes, lambda p: _alive(earlier, p))
    finally:
        earlier.close()
    dead = [p.name for p, a in zip(record.plan.processes, alive, strict=True) if not a]
    if dead:
        raise UcmctlError.one(
            f"deployment '{name}' is already up, but {', '.join(dead)} is not running",
            fix=f"`ucmctl restart {name} {' '.join(dead)}`, or `ucmctl down {name}` and `up` again",
        )
    d = diff(record.plan, plan, restart_changed=True, how="this topology")
    tell = lambda line: console.print(escape(line), soft_wrap=True)  # noqa: E731
    if d.empty:
        tell(f"deployment '{name}' is already up with this topology: nothing to change")
    else:
        what = [
            f"start {', '.join(p.name for p in d.added)}" if d.added else "",
            f"take out {', '.join(p.name for p in d.removed)}" if d.removed else "",
            f"restart {', '.join(was.name for was, _ in d.changed)}" if d.changed else "",
        ]
        tell(
            f"deployment '{name}' is up: this topology will "
            + "; ".join(w for w in what if w)
            + " (the rest stays running)"
        )
        apply(
            record,
            store,
            plan,
            d,
            drain=options.drain,
            grace=options.stop_grace,
            tell=tell,
            check=not options.skip_preflight,
            probe=options.kv_probe,
            connect_timeout=options.connect_timeout,
        )
    record.plan, record.topology_path, record.topology_digest = plan, topology_path, plan.topology_digest
    store.save(record)
    return record


def _refuse_if_running(existing: Record | None, options: Options) -> None:
    """This machine's record of the deployment names processes that still run: refuse."""
    if existing is None or existing.status not in (Status.starting, Status.up, Status.failed):
        return
    earlier = launcher_for(existing.plan, existing.allocation, connect_timeout=options.connect_timeout)
    try:
        alive = parallel(existing.plan.processes, lambda p: _alive(earlier, p))
    finally:
        earlier.close()
    running = [p.name for p, a in zip(existing.plan.processes, alive, strict=True) if a]
    if running:
        raise UcmctlError.one(
            f"deployment '{existing.deployment}' is already up ({counted(len(running), 'process')} running)",
            fix=f"run `ucmctl down {existing.deployment}` first",
        )


def _preflight(plan: Plan, launcher: Launcher, options: Options, console: Console) -> Preflight:
    """Check every node; returns what was found (the commands that tidy up after the checks, per
    node, and each node's facts for the record)."""
    if options.skip_preflight:
        return Preflight([])
    console.print(f"preflight on {counted(len(launcher.all()), 'node')} ...")
    checked = preflight(plan, launcher.all())
    for line in checked.notes:
        console.print(f"  {line}", markup=False, soft_wrap=True)
    for line in checked.warnings:
        console.print(f"warning: {line}", markup=False, soft_wrap=True)
    if checked.problems:
        _run_each(launcher, checked.cleanup)
        raise UcmctlError([Problem(p) for p in checked.problems], status=ExitStatus.NOT_READY)
    return checked


def _stage_and_start(
    topology_path: str,
    plan: Plan,
    launcher: Launcher,
    checked: Preflight,
    options: Options,
    console: Console,
    store: StateStore,
) -> Record:
    running = _stage_files(launcher, plan, checked.cleanup)
    if running:
        raise UcmctlError.one(
            f"deployment '{plan.deployment}' already runs on the nodes ({', '.join(running)})",
            fix=f"run `ucmctl down {plan.deployment}` first",
            status=ExitStatus.NOT_READY,
        )
    record = Record(
        deployment=plan.deployment,
        topology_path=topology_path,
        topology_digest=plan.topology_digest,
        plan=plan,
        processes={p.name: ProcessState(name=p.name, node=p.node) for p in plan.processes},
        allocation=launcher.allocation,
        node_facts=checked.facts,
    )
    store.save(record)  # before anything starts: `down` can always find what this run did
    progress = Progress(plan, console)
    failure: tuple[Process, str] | None = None
    try:
        with progress:
            for stage in plan.stages():
                failure = _start_stage(launcher, record, store, stage, progress, options)
                if failure:
                    break
    except (KeyboardInterrupt, Exception) as exc:  # Ctrl-C or a bug mid-start: take back what started
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"internal error ({exc!r})"
        console.print(f"{what}: stopping what this `up` started", markup=False)
        cancelled.clear()
        _, not_stopped = _stop_all(launcher, plan, options.stop_grace, console)
        if not not_stopped:
            _give_back(launcher, store, console)
        raise
    if failure is None:
        probe_failed = _probe(plan, record, options, console)
        if probe_failed is None:
            record.status = Status.up
            store.save(record)
            return record
        reason = f"KV probe: {probe_failed}"
    else:
        process, why = failure
        tail = launcher.log_tail(process, 50)
        console.print(f"[red]{process.name}[/] on node {process.node} failed: {escape(why)}")
        console.print(f"last 50 lines of {process.log}:", markup=False)
        console.print(tail or "(empty)", markup=False, highlight=False)
        reason = f"{process.name} on node {process.node} failed: {why}"
    record.status = Status.failed
    store.save(record)
    if not options.keep_on_failure:
        _, not_stopped = _stop_all(launcher, plan, options.stop_grace, console)
        if not not_stopped and _give_back(launcher, store, console):
            console.print("stopped everything this `up` started")
    else:
        console.print(f"kept running for debugging: `ucmctl down {plan.deployment}` stops it")
    raise UcmctlError.one(reason, status=ExitStatus.FAILURE)


def _probe(plan: Plan, record: Record, options: Options, console: Console) -> str | None:
    """Run the KV probe unless opted out or moot; the failure's one line, or None."""
    if not options.kv_probe:
        return None
    moot = kv_probe.applies(plan)
    if moot is not None:
        console.print(f"KV probe skipped: {moot}", markup=False)
        return None
    proxies = [p for p in plan.processes if p.role == "proxy"]
    several = len(proxies) > 1
    console.print(f"KV probe: one request through {'each proxy' if several else 'the proxy'} ...")
    for proxy in proxies:  # replicas: each one's path proved, as each one routes on its own
        result = kv_probe.run_probe(plan, proxy)
        record.kv_probe = result
        said = f"through {proxy.name}: {result.detail}" if several else result.detail
        if not result.ok:
            return said
        console.print(f"KV probe: {said}", markup=False)
    return None


def _alive(launcher: Launcher, process: Process) -> bool:
    try:
        return launcher.alive(process) is not None
    except NodeError:
        return False


def _stage_files(launcher: Launcher, plan: Plan, cleanup: dict[str, list[str]]) -> list[str]:
    """Every node at once, one round trip each; returns processes of this deployment found
    running (say, after the local record was lost): then nothing was staged on their nodes."""
    found = parallel(launcher.all(), lambda n: stage_node(launcher[n], plan.on_node(n), cleanup.get(n)))
    return [name for names in found for name in names]


def _run_each(launcher: Launcher, commands: dict[str, list[str]]) -> None:
    """Best effort, in parallel: commands that tidy up after a failed preflight."""

    def run(node: str) -> None:
        with contextlib.suppress(NodeError):
            launcher[node].run("; ".join(commands[node]))

    parallel(commands, run)


def _health_timeout(process: Process, options: Options) -> float:
    return options.health_timeout if options.health_timeout is not None else process.health_timeout


def _start_stage(
    launcher: Launcher,
    record: Record,
    store: StateStore,
    stage: list[Process],
    progress: Progress,
    options: Options,
) -> tuple[Process, str] | None:
    def start_one(process: Process) -> str | None:
        progress.set(process.name, "starting")
        reason = start_gated(
            launcher,
            record,
            store,
            process,
            timeout=_health_timeout(process, options),
            on_started=lambda: progress.set(process.name, "waiting for health"),
            cancelled=cancelled.is_set,
        )
        progress.set(process.name, "healthy" if reason is None else "failed")
        return reason

    reasons = parallel(stage, start_one)
    for process, reason in zip(stage, reasons, strict=True):
        if reason is not None:
            return process, str(reason)
    return None


def _stop_all(
    launcher: Launcher, plan: Plan, grace: float, console: Console
) -> tuple[list[tuple[Process, lifecycle.Stopped]], list[Process]]:
    """Reverse start order, each stage in parallel; returns what stopped and what could not be."""
    results: list[tuple[Process, lifecycle.Stopped]] = []
    failed: list[Process] = []
    for stage in reversed(plan.stages()):

        def stop_one(process: Process) -> tuple[Process, lifecycle.Stopped | None]:
            try:
                return process, launcher.stop(process, grace=grace)
            except NodeError as exc:
                console.print(f"[yellow]could not stop {process.name}:[/] {escape(exc.reason)}")
                return process, None

        for process, stopped in parallel(stage, stop_one):
            if stopped is None:
                failed.append(process)
            else:
                results.append((process, stopped))
    return results, failed


def deploy_down(
    deployment_or_plan: str | Plan,
    *,
    grace: float = 15.0,
    console: Console | None = None,
    store: StateStore | None = None,
) -> list[tuple[str, str, bool]]:
    """Stop every process of a deployment; returns (process, node, was running).

    Refused (BUSY) while an `up` of it runs from this machine: that `up` would go on starting
    what this stops. Ctrl-C there stops what it started."""
    console = console or Console(stderr=True, emoji=False)
    store = store or StateStore()
    name = deployment_or_plan.deployment if isinstance(deployment_or_plan, Plan) else deployment_or_plan
    with store.lock(name, "down"):
        record = store.load(name)
        if isinstance(deployment_or_plan, Plan):
            plan = deployment_or_plan
        elif record is None:
            raise UcmctlError.one(
                f"no deployment named '{name}' on this machine",
                fix="pass the topology file instead: `ucmctl down TOPOLOGY` finds its processes on the nodes",
            )
        else:
            plan = record.plan
        launcher = launcher_for(plan, record.allocation if record else None)
        try:
            stopped, failed = _stop_all(launcher, plan, grace, console)
            if not failed:  # the deployment's containers of another plan of it, or of a lost record
                for node, process in launcher.sweep(grace=grace):
                    console.print(
                        f"stopped a process of {escape(plan.deployment)} not in its plan: "
                        f"{escape(process)} on {escape(node)}"
                    )
            if failed:  # keep the record: a later `down` must still find these
                names = ", ".join(f"{p.name} ({p.node})" for p in failed)
                raise UcmctlError.one(
                    f"could not stop {names}",
                    status=ExitStatus.FAILURE,
                    fix="check the node, then run `ucmctl down` again",
                )
            if not launcher.release():
                raise UcmctlError.one(
                    f"deployment '{plan.deployment}': the scheduler still lists its job",
                    status=ExitStatus.FAILURE,
                    fix="run `ucmctl down` again",
                )
        except LaunchError as exc:
            raise UcmctlError.one(str(exc), status=exc.status, fix="run `ucmctl down` again") from None
        finally:
            launcher.close()
        store.remove(plan.deployment)
    return [(p.name, p.node, s.was_running) for p, s in stopped]


def purge(plan: Plan) -> int:
    """Delete the store's folders (`<backend>/<3 hex digits>/` and the quarantine `corrupt/`) from
    one node of the store's users (the backends are shared); nothing else under the backend is
    touched. Returns how many folders went. Works from a deployment record's plan alone."""
    if plan.store is None:
        raise UcmctlError.one(f"deployment '{plan.deployment}' has no storage to purge")
    nodes = plan.store_nodes()
    if not nodes:
        return 0
    node = nodes[0]
    launcher = launcher_for(plan)
    removed = 0
    try:
        for backend in plan.store.backends:
            q = shlex.quote(backend)
            script = (
                f"cd {q} 2>/dev/null || exit 0; n=0; for d in [0-9a-f][0-9a-f][0-9a-f] corrupt; do "
                '[ -d "$d" ] && rm -rf -- "$d" && n=$((n + 1)); done; echo $n'
            )
            done = launcher.standalone(node).run(script, timeout=600)
            removed += int(done.stdout.strip() or 0)
    finally:
        launcher.close()
    return removed


def install_wheel(
    plan: Plan, wheel: Path, *, no_deps: bool = False, accept_new_host_keys: bool = False
) -> list[tuple[str, str]]:
    """Copy the wheel to each node's run folder and pip-install it with the node's Python."""
    data = wheel.read_bytes()
    launcher = launcher_for(plan, accept_new_host_keys=accept_new_host_keys)

    def one(node: str) -> tuple[str, str]:
        ex = launcher.standalone(node)
        target = f"{posixpath.dirname(plan.nodes[node].run_dir)}/wheels/{wheel.name}"
        ex.put(target, data)
        flags = "--no-deps " if no_deps else ""
        python = shlex.quote(plan.nodes[node].python)
        done = ex.run(
            f"{python} -m pip install --quiet --force-reinstall {flags}{shlex.quote(target)}", timeout=900
        )
        if not done.ok:
            return node, f"failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
        return node, f"installed {wheel.name}"

    try:
        return parallel(plan.nodes, one)
    finally:
        launcher.close()
