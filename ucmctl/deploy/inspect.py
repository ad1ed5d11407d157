"""`status` and `logs`: read what runs, from the nodes, for a deployment."""

from __future__ import annotations

import shlex
import textwrap
import time
import urllib.request
from typing import NamedTuple

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ucmctl.core.store_errors import describe, errors_from_metrics
from ucmctl.core.tables import FIGURE, NAME, TEXT, fitted
from ucmctl.deploy.health import NOT_ASKED, UNKNOWN, Health, HealthKind, why_not
from ucmctl.deploy.proxy_client import routing_line
from ucmctl.deploy.state import Record
from ucmctl.launch import Launcher, LaunchError, launcher_for
from ucmctl.nodes.executor import NodeError
from ucmctl.nodes.fanout import parallel
from ucmctl.nodes.run_state import Kind, RunState
from ucmctl.plan.model import Process


def the_deployment(command: str, alternative: str = "") -> str:
    """The one deployment this machine has a record of, for a command given none; with none or
    several, one line that lists them (exit 2)."""
    from ucmctl.core.errors import UcmctlError
    from ucmctl.deploy.state import StateStore

    names = [r.deployment for r in StateStore().all()]
    if len(names) == 1:
        return names[0]
    other = f", {alternative}" if alternative else ""
    if not names:
        raise UcmctlError.one(
            f"`ucmctl {command}`: no deployment on this machine",
            fix=f"start one with `ucmctl up TOPOLOGY`{other}",
        )
    raise UcmctlError.one(
        f"`ucmctl {command}`: {len(names)} deployments on this machine: {', '.join(names)}",
        fix=f"name one, e.g. `ucmctl {command} {names[0]}`{other}"
        if command != "bench"
        else f"name one, e.g. `ucmctl bench -d {names[0]}`{other}",
    )


def status_table(record: Record, width: int = 80) -> list[Table]:
    """The deployment's processes as they are now, asked of the nodes (an unreachable node is
    a row that says so); laid out for `width` columns with every name and port whole."""
    launcher = launcher_for(record.plan, record.allocation, connect_timeout=5)
    try:
        looks = parallel(record.plan.processes, lambda p: look(launcher, p))
        try:
            scheduler = launcher.view()
        except LaunchError as exc:
            scheduler = [str(exc)]
        scheduler += storage_health(record, launcher)
        for p, now in zip(record.plan.processes, looks, strict=True):
            # asked of a proxy that answers its health only: a silent one would cost the timeout
            if p.role == "proxy" and now.health.kind is HealthKind.healthy and (line := routing_line(p)):
                scheduler.append(line)
    finally:
        launcher.close()
    return render_status(record, looks, time.time(), width, scheduler)


class Look(NamedTuple):
    """How a process is now, as `status` says it."""

    state: RunState  # running, exited (137), not running, node unreachable, ...
    health: Health  # healthy, unhealthy (why), not asked, unknown (node unreachable)

    @property
    def restarts(self) -> int:
        """By its restart policy since it was started (the runtime's or ucmctl's count)."""
        return self.state.restarts


def look(launcher: Launcher, p: Process, health_timeout: float = 2.0) -> Look:
    """How `p` is now: its state (with its restarts) and its health, asked of its node; the
    health only of a process that runs."""
    try:
        state = launcher.run_state(p)
    except NodeError:
        return Look(RunState(Kind.unreachable), UNKNOWN)
    if not state.running or not p.health:
        return Look(state, NOT_ASKED)
    return Look(state, Health.of(why_not(p.health[-1], timeout=health_timeout)))


# awk over /proc/self/mountinfo: the filesystem type of the longest mount point above path `p`.
_MOUNT_OF = shlex.quote(
    '{m = $5; if (m == "/") m = ""; if (index(p, m "/") == 1 && length(m) >= n) {n = length(m); t = $(NF-2)}}'
    " END {print t}"
)
# What a store user's log says when the store failed it (the connector's and the simulator's).
_STORE_ERROR_LOG = "UCM (lookup|load|save) error"


def storage_health(record: Record, launcher: Launcher) -> list[str]:
    """One line per node that runs the store: each backend's filesystem and whether it answers
    now (a stat within 3 s: a stalled mount does not), the errors the node's servers counted
    since they started, and the last such error their logs hold."""
    plan = record.plan
    if plan.store is None or not plan.store.users:
        return []
    users = [p for p in plan.processes if p.name in set(plan.store.users)]
    nodes = list(dict.fromkeys(p.node for p in users))
    backends = plan.store.backends

    def look(node: str) -> list[str]:
        mine = [p for p in users if p.node == node]
        script = []
        for i, b in enumerate(backends):
            q = shlex.quote(b)
            # the mount table alone (a stat of a stalled or disconnected mount would hang or fail)
            script.append(
                f"echo fs{i}=$(awk -v p={shlex.quote(b.rstrip('/') + '/')} {_MOUNT_OF} /proc/self/mountinfo)"
            )
            script.append(f'm=$(timeout 3 stat -c %F {q} 2>&1 >/dev/null); echo "stat{i}=$?:${{m##*: }}"')
        for j, p in enumerate(mine):
            if not p.detached:
                grep = f"grep -E {shlex.quote(_STORE_ERROR_LOG)} | tail -n 1 | cut -c1-300"
                script.append(f"echo last{j}=$(tail -n 20000 {shlex.quote(p.log)} 2>/dev/null | {grep})")
        try:
            done = launcher.executor(node).run("\n".join(script), timeout=20)
        except NodeError as exc:
            return [f"storage on {node}: node unreachable ({exc.reason})"]
        facts = dict(line.partition("=")[::2] for line in done.stdout.splitlines() if "=" in line)
        states = []
        for i, b in enumerate(backends):
            fs = facts.get(f"fs{i}", "").strip() or "?"
            code, _, reason = facts.get(f"stat{i}", "").strip().partition(":")
            answer = {"0": "answers", "124": "NOT ANSWERING (no stat within 3 s)"}.get(
                code, f"FAILS ({reason.strip() or 'no answer'})"
            )
            states.append(f"{b}: {fs}, {answer}" if len(backends) > 1 else f"{fs}, {answer}")
        counted: dict[str, float] = {}
        unread = []
        for p in mine:
            try:
                text = urllib.request.urlopen(f"{p.url}/metrics", timeout=5).read().decode(errors="replace")
            except (OSError, ValueError):
                unread.append(p.name)
                continue
            for k, v in errors_from_metrics(text).items():
                counted[k] = counted.get(k, 0.0) + v
        said = describe(counted) or "none"
        if unread:
            said += f" (no /metrics from {', '.join(unread)})"
        lines = [f"storage on {node}: {'; '.join(states)}; errors since start: {said}"]
        for j, p in enumerate(mine):
            last = facts.get(f"last{j}", "").strip()
            if last:
                lines.append(f"  last in {p.name}: {last}")
        return lines

    return [line for lines in parallel(nodes, look) for line in lines]


def render_status(
    record: Record,
    looks: list[Look],
    now: float,
    width: int = 80,
    scheduler: list[str] | None = None,
) -> list[Table]:
    """The status table of `record` given how each process looks, in plan order, and
    the scheduler's lines (Slurm's job and lost nodes) under it."""
    probe = record.kv_probe
    lines = list(scheduler or [])
    if probe is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(probe.at))
        lines.append(f"KV probe {'passed' if probe.ok else 'FAILED'} at {when}: {probe.detail}")
    # each wrapped between words at the width (the console does not wrap: tables stay whole)
    notes = [
        escape(textwrap.fill(line, width, subsequent_indent="  ", break_long_words=False)) for line in lines
    ]
    caption = "\n".join(notes) or None
    rows = []
    for p, (state, health) in zip(record.plan.processes, looks, strict=True):
        ps = record.processes.get(p.name)
        started = ps.started_at if ps else None
        restarted = state.restarts
        # after a restart of its own the time since `up` is not its uptime
        uptime = _duration(now - started) if started and state.running and not restarted else "-"
        color = "green" if health.kind is HealthKind.healthy else "red"
        ports = " ".join(f"{k}:{v}" for k, v in p.ports.items()) or "-"
        words = state.words()
        asked = health.kind in (HealthKind.healthy, HealthKind.unhealthy)
        said = f"{words}, [{color}]{escape(health.words())}[/]" if asked else words
        rows.append(
            [
                escape(p.name),
                escape(p.node),
                str(p.role),
                ports,
                said,
                uptime,
                str((ps.restarts if ps else 0) + restarted),
            ]
        )
    lead = [("process", NAME), ("node", NAME)]
    rest = [("role", NAME), ("ports", NAME), ("state", TEXT), ("uptime", FIGURE), ("restarts", FIGURE)]
    title = f"deployment {escape(record.deployment)} ({record.status})"
    tables = fitted(width, title, lead, rest, rows)
    tables[-1].caption = caption
    tables[-1].caption_justify = "left"
    return tables


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def show_logs(record: Record, names: list[str], lines: int, follow: bool, console: Console) -> None:
    """Last `lines` of each process's log, prefixed `process@node |`; with follow, keep reading."""
    processes = [p for p in record.plan.processes if not names or p.name in names]
    launcher = launcher_for(record.plan, record.allocation, connect_timeout=5)
    offsets: dict[str, int] = {}
    try:
        for p in processes:
            size, text = _read(launcher, p, None, lines)
            offsets[p.name] = size
            _print(console, p, text)
        while follow:
            time.sleep(1.0)
            for p in processes:
                size, text = _read(launcher, p, offsets[p.name], lines)
                if size < offsets[p.name]:  # the log was truncated or replaced: start over
                    size, text = _read(launcher, p, 0, lines)
                offsets[p.name] = size
                _print(console, p, text)
    finally:
        launcher.close()


def tail_of(launcher: Launcher, p: Process, lines: int) -> str:
    """The last `lines` lines of a process's log (the runtime's, for a container)."""
    return _read(launcher, p, None, lines)[1]


def _read(launcher: Launcher, p: Process, offset: int | None, lines: int) -> tuple[int, str]:
    """The log's end (offset None) or what follows `offset`, and the new offset: bytes of the log
    file, or lines of a container's log (the runtime's)."""
    log = shlex.quote(p.log)
    if p.detached:
        assert p.container is not None
        rt, name = shlex.quote(p.container.runtime), shlex.quote(p.container.name)
        rest = f"tail -n {int(lines)}" if offset is None else f"tail -n +{int(offset) + 1} | head -c 1048576"
        cmd = (
            f'f=$(mktemp); trap \'rm -f "$f"\' EXIT; {rt} logs {name} >"$f" 2>&1 || exit 0; '
            f'wc -l < "$f"; {rest} < "$f"'
        )
    elif offset is None:
        cmd = f"[ -f {log} ] || exit 0; wc -c < {log}; tail -n {int(lines)} {log}"
    else:
        cmd = f"[ -f {log} ] || exit 0; wc -c < {log}; tail -c +{int(offset) + 1} {log} | head -c 1048576"
    try:
        done = launcher[p.node].run(cmd, timeout=30)
    except NodeError as exc:
        return offset or 0, f"(node unreachable: {exc.reason})\n"
    first, _, rest = done.stdout.partition("\n")
    if not first.strip().isdigit():
        return offset or 0, ""
    size = int(first.strip())
    if offset is not None and not p.detached:
        rest = rest[: max(0, size - offset)]
    return size, rest


def _print(console: Console, p: Process, text: str) -> None:
    prefix = f"{p.name}@{p.node} | "
    for line in text.splitlines():
        console.print(prefix + line, markup=False, highlight=False, soft_wrap=True)
