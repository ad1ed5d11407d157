"""Processes that systemd restarts: one transient unit per process (`systemd-run`), on a node
whose init is systemd (the topology's `systemd: true`; preflight proves it) and a process with
`restart: on-failure` that runs bare.

The unit runs the plan's `unit.sh`: the session leader writes its pid to the pidfile and runs the
launch script with the process's marker, its output appended to the log, as ucmctl's own start
does; so everything that finds a process by its pidfile and marker (alive, signal, status, the
preflight's "already runs", strays) finds it unchanged. What systemd adds: the process is started
again when it fails (Restart=on-failure, also after a TERM of its own, as ucmctl's supervisor
does; RestartSec=backoff_s; at most max_restarts times: StartLimitBurst over an endless
interval), its restarts are counted (NRestarts), and how its last run ended is kept. `stop`
stops the unit first (a stop job: no restart after it), then the process group as always.

The unit's name comes from the process's folder (its name and a digest of the folder's path), so
a stray found by its folder has its unit too. Root uses the system manager, another user its own
(`systemctl --user`, which needs `loginctl enable-linger USER`).
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex

from ucmctl.nodes.executor import Executor
from ucmctl.plan.model import Process

# The systemd scope of the SSH user, for every systemctl and systemd-run below.
SCOPE = 'S=; [ "$(id -u)" = 0 ] || S=--user'
_SHOW = ("LoadState", "ActiveState", "SubState", "NRestarts", "ExecMainCode", "ExecMainStatus")


def managed(process: Process) -> bool:
    """Whether systemd restarts `process` (its plan says so)."""
    return process.restart is not None and process.restart.by == "systemd"


def unit_name(process: Process) -> str:
    folder = posixpath.dirname(process.pidfile)
    return f"ucmctl-{process.name}-{hashlib.sha256(folder.encode()).hexdigest()[:10]}.service"


def spawn_lines(process: Process) -> str:
    """Shell that starts the process's unit (the caller waits for its pidfile). A failed unit of
    an earlier run is cleared first; one still active is not touched: systemd-run then refuses,
    and the start fails with its words."""
    restart = process.restart
    assert restart is not None and restart.script is not None and restart.backoff_s is not None
    unit, log = shlex.quote(unit_name(process)), shlex.quote(process.log)
    # systemd replaces $NAME in a unit's command line: a literal $ is written $$
    script = shlex.quote(restart.script.replace("$", "$$"))
    props = [
        "Restart=on-failure",
        f"RestartSec={restart.backoff_s:g}",
        "RestartForceExitStatus=SIGTERM SIGINT SIGHUP",  # as ucmctl's supervisor: not a clean end
        "StartLimitIntervalSec=infinity",
        f"StartLimitBurst={restart.max_restarts + 1}",  # the first start and max_restarts more
        "KillMode=control-group",
    ]
    description = shlex.quote(f"ucmctl: {process.name} ({posixpath.dirname(process.pidfile)})")
    return f"""
{SCOPE}
rm -f {shlex.quote(process.pidfile)}
[ -f {log} ] && mv -f {log} {log}.1  # the last 50 lines shown on failure are this run's
systemctl $S reset-failed {unit} 2>/dev/null
systemd-run $S --quiet --unit={unit} --description={description} \\
  {" ".join(f"-p {shlex.quote(p)}" for p in props)} \\
  --setenv=HOME="$HOME" --setenv=PATH="$PATH" /bin/sh {script} || exit 3
"""


def stop_lines(process: Process, grace: float) -> str:
    """Shell that stops the unit (TERM to its processes, KILL after `grace` s), so systemd does
    not start it again, and forgets it; the caller then stops what is left of the group."""
    unit = shlex.quote(unit_name(process))
    return f"""
{SCOPE}
timeout {grace + 5:g} systemctl $S stop {unit} >/dev/null 2>&1
systemctl $S reset-failed {unit} >/dev/null 2>&1
"""


def state(ex: Executor, process: Process) -> tuple[int, int, str] | None:
    """(restarts so far, how the last run ended as an exit code (128 + signal when killed),
    what the unit does now: running, waiting (to restart), gave-up, done, stopped); None when
    systemd has no such unit (never started here, or stopped and forgotten)."""
    unit = shlex.quote(unit_name(process))
    props = " ".join(f"-p {p}" for p in _SHOW)
    done = ex.run(f"{SCOPE}\nsystemctl $S show {unit} {props} 2>/dev/null || true", timeout=30)
    shown = dict(line.partition("=")[::2] for line in done.stdout.splitlines() if "=" in line)
    if shown.get("LoadState") != "loaded" or not shown.get("NRestarts", "").isdigit():
        return None
    code, status = shown.get("ExecMainCode", "0"), shown.get("ExecMainStatus", "0")
    last = int(status) if status.isdigit() else 0
    if code in ("2", "3"):  # CLD_KILLED, CLD_DUMPED: the status is the signal
        last += 128
    active, sub = shown.get("ActiveState", ""), shown.get("SubState", "")
    if sub == "auto-restart":
        what = "waiting"
    elif active in ("active", "activating", "reloading"):
        what = "running"
    elif active == "failed":
        what = "gave-up"
    else:
        what = "done" if last == 0 else "stopped"
    restarts = int(shown["NRestarts"])
    if what == "gave-up" and process.restart is not None:  # it counts the restart its limit refused
        restarts = min(restarts, process.restart.max_restarts)
    return restarts, last, what
