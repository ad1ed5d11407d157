"""Process lifecycle on a node, independent of the SSH channel that started it.

A process runs in its own session (`setsid`) with every standard stream redirected; its pidfile
is written by the new session leader itself, so the pid in it is the process-group id. Stopping
signals the whole group (TERM, a grace period, then KILL). A group counts as alive while any
member is not a zombie, and it is only signalled when a member carries this process's
`UCMCTL_PROCESS` marker in its environment: a recycled pid is never killed. Processes are never
matched by name.
"""

from __future__ import annotations

import math
import posixpath
import re
import shlex
from dataclasses import dataclass

from ucmctl.nodes import units
from ucmctl.nodes.executor import Executor, NodeError, Watch
from ucmctl.nodes.run_state import Kind, RunState
from ucmctl.plan.model import Process, process_marker

# Prints the number of live (non-zombie) members of process group $1 that carry marker $2.
# The marker holds a path (the launch script's), so it is matched as a fixed string (-F):
# a workdir like /srv/run[1] is a regular expression that does not match itself.
# Reading a process's environment takes its memory map's lock: a process stuck in the kernel
# (in I/O on a network filesystem that hangs, or tearing down a large memory) can hold that read
# for as long as it is stuck. A read that does not end in 3 s counts the process as a member
# (it is alive, in the group ucmctl started) instead of hanging the whole check.
_MEMBERS = r"""
# The live (non-zombie) processes of group $1: pid, pgid, state.
group() {
  ps -e -o pid=,pgid=,stat= | awk -v g="$1" '$2 == g && $3 !~ /^Z/'
}
members() {
  for p in $(group "$1" | awk '{print $1}'); do
    timeout -s KILL 3 grep -qzxF -e "$2" /proc/$p/environ 2>/dev/null
    case $? in
      0|124|137) echo "$p" ;;
      # an empty environment: a process exiting (its memory going, its sockets not closed yet)
      1) [ "$(head -c1 /proc/$p/environ 2>/dev/null | wc -c)" -eq 0 ] && echo "$p" ;;
    esac
  done | wc -l
}
# The members of group $1 that outlived SIGKILL, with their state and where in the kernel they wait.
stuck() {
  for p in $(group "$1" | awk '{print $1}'); do ps -o pid=,stat=,wchan:40= -p "$p"; done |
    awk '{printf " pid %s (%s, in %s)", $1, $2, $3}'
}
"""


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a process name, as plans make them


def marker(process: Process) -> str:
    return process_marker(process.name, process.launch)


@dataclass(frozen=True)
class Started:
    pgid: int


@dataclass(frozen=True)
class Stopped:
    was_running: bool
    killed: bool  # needed SIGKILL after the grace period


def spawn(process: Process, *, foreground: bool = False) -> str:
    """Shell that starts the launch script in a session of its own, its log rotated, its pidfile
    written by the session leader. In the background (SSH: the command returns at once), or
    in the foreground, lasting as long as the process (a Slurm job step is the process)."""
    pidfile, log, launch = (shlex.quote(x) for x in (process.pidfile, process.log, process.launch))
    mark = shlex.quote(marker(process))
    setsid, end = ("exec setsid -w", "") if foreground else ("setsid", " &")
    return f"""
rm -f {pidfile}
[ -f {log} ] && mv -f {log} {log}.1  # the last 50 lines shown on failure are this run's
{setsid} env {mark} sh -c 'echo $$ > "$0.tmp" && mv "$0.tmp" "$0"; exec sh "$1"' {pidfile} {launch} \\
  >>{log} 2>&1 </dev/null{end}
"""


def start(ex: Executor, process: Process, *, wait: float = 10) -> Started:
    """Start the launch script detached (or its systemd unit, when systemd restarts it); returns
    the process-group id from its pidfile."""
    pidfile = shlex.quote(process.pidfile)
    tries = int(wait * 10)
    script = f"""
set -u
{units.spawn_lines(process) if units.managed(process) else spawn(process)}
i=0
while [ ! -s {pidfile} ] && [ $i -lt {tries} ]; do sleep 0.1; i=$((i + 1)); done
[ -s {pidfile} ] || {{ echo "no pidfile after {wait:.0f} s" >&2; exit 3; }}
cat {pidfile}
"""
    done = ex.run(script, timeout=wait + 30)
    if not done.ok:
        raise NodeError(
            ex.node.name, f"could not start {process.name}: {done.stderr.strip() or done.stdout.strip()}"
        )
    return Started(int(done.stdout.split()[-1]))


def alive(ex: Executor, process: Process) -> int | None:
    """The process group id if the process is running (per its pidfile), else None."""
    pidfile, mark = shlex.quote(process.pidfile), shlex.quote(marker(process))
    script = (
        _MEMBERS
        + f"""
[ -s {pidfile} ] || exit 0
g=$(cat {pidfile})
[ "$(members "$g" {mark})" -gt 0 ] && echo "$g"
exit 0
"""
    )
    done = ex.run(script, timeout=30)
    out = done.stdout.strip()
    return int(out) if out.isdigit() else None


def watch(ex: Executor, process: Process) -> Watch:
    """A loop on the node that lasts while the process runs: `finished()` turns true when the
    process is gone. It prints a byte a second, so closing it ends the loop within a second."""
    pidfile, mark = shlex.quote(process.pidfile), shlex.quote(marker(process))
    script = (
        _MEMBERS
        + f"""
g=$(cat {pidfile} 2>/dev/null)
while [ -n "$g" ] && [ "$(members "$g" {mark})" -gt 0 ]; do echo . || exit 0; sleep 1; done
"""
    )
    return ex.watch(script)


def running_lines(processes: list[Process]) -> str:
    """Shell printing `running NAME` for each process whose pidfile names a live, marked group
    (the check of `alive`, for many processes in one round trip)."""
    lines = [_MEMBERS]
    for p in processes:
        pidfile, mark, name = shlex.quote(p.pidfile), shlex.quote(marker(p)), shlex.quote(p.name)
        lines.append(
            f'if [ -s {pidfile} ] && [ "$(members "$(cat {pidfile})" {mark})" -gt 0 ]; '
            f"then echo running {name}; fi"
        )
    return "\n".join(lines)


def strays(ex: Executor, template: Process, known: set[str], launches: set[str]) -> list[Process]:
    """Processes of the deployment running on this node that are not among `known` (a scale of a
    lost record, another plan of it): each folder beside `template`'s whose pidfile names a live
    group carrying that folder's own marker, for one of the `launches` script names (launch.sh,
    or supervise.sh under a restart policy). Returned as `template` renamed, so `stop` takes them."""
    folder = posixpath.dirname(template.pidfile)
    run_dir, pid = posixpath.dirname(folder), posixpath.basename(template.pidfile)
    if posixpath.dirname(template.launch) != folder:
        return []
    script = (
        _MEMBERS
        + f"""
r={shlex.quote(run_dir)}; f={shlex.quote(pid)}
cd "$r" 2>/dev/null || exit 0
for d in */; do
  n=${{d%/}}
  [ -s "$n/$f" ] || continue
  for l in {" ".join(shlex.quote(x) for x in sorted(launches))}; do
    if [ "$(members "$(cat "$n/$f")" "UCMCTL_PROCESS=$n@$r/$n/$l")" -gt 0 ]; then echo "stray $l $n"; fi
  done
done
"""
    )
    done = ex.run(script, timeout=60)
    found = [line.split(" ", 2)[1:] for line in done.stdout.splitlines() if line.startswith("stray ")]
    return [
        template.model_copy(
            update={
                "name": n,
                "pidfile": f"{run_dir}/{n}/{pid}",
                "launch": f"{run_dir}/{n}/{launch}",
                "log": f"{run_dir}/{n}/{posixpath.basename(template.log)}",
            }
        )
        for launch, n in found
        if n not in known and _NAME.fullmatch(n)
    ]


def stop(ex: Executor, process: Process, *, grace: float = 10) -> Stopped:
    """TERM the group, wait up to `grace` seconds, KILL what is left, remove the pidfile. A
    process systemd restarts: its unit is stopped first (also while it waits to restart). The
    waits are by the clock, not by a count of checks: on a loaded node each check (ps, and the
    environment of each process of the group) took long enough that 150 of them outlasted the
    command's own timeout (seen: `down` failing on a CI machine running four vLLM servers)."""
    pidfile, mark = shlex.quote(process.pidfile), shlex.quote(marker(process))
    term_s = max(1, math.ceil(grace))
    unit = units.stop_lines(process, grace) if units.managed(process) else ""
    script = (
        _MEMBERS
        + f"""
g=$(cat {pidfile} 2>/dev/null)
case "$g" in *[!0-9]*|''|0|1) g= ;; esac
live=0
[ -n "$g" ] && live=$(members "$g" {mark})
{unit}
if [ "$live" -eq 0 ]; then rm -f {pidfile}; echo absent; exit 0; fi
kill -TERM -"$g" 2>/dev/null  # dash's kill takes no `--`
end=$(($(date +%s) + {term_s}))  # whole seconds: the grace, and up to a second more
while [ "$(members "$g" {mark})" -gt 0 ] && [ "$(date +%s)" -le "$end" ]; do sleep 0.1; done
if [ "$(members "$g" {mark})" -gt 0 ]; then
  kill -KILL -"$g" 2>/dev/null
  end=$(($(date +%s) + 5))
  while [ "$(members "$g" {mark})" -gt 0 ] && [ "$(date +%s)" -le "$end" ]; do sleep 0.1; done
  if [ "$(members "$g" {mark})" -gt 0 ]; then
    echo "process group $g outlived SIGKILL by 5 s:$(stuck "$g");" \
      "a process in state D waits in the kernel (on I/O of a hung filesystem?)" >&2
    exit 4
  fi
  echo killed
else
  echo stopped
fi
rm -f {pidfile}
"""
    )
    done = ex.run(script, timeout=grace + 30)
    if not done.ok:
        raise NodeError(ex.node.name, f"could not stop {process.name}: {done.stderr.strip()}")
    word = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "absent"
    return Stopped(was_running=word != "absent", killed=word == "killed")


@dataclass(frozen=True)
class Supervised:
    """What ucmctl's supervisor (restart: on-failure) last wrote of a process's ends."""

    restarts: int  # so far
    last_exit: int
    what: str  # running (restarted), waiting (to restart), gave-up, done, stopped
    by_systemd: bool = False  # its unit says it; nothing of the process runs while it waits

    def run_state(self, running: bool, max_restarts: int) -> RunState:
        """The process's state, given whether it runs now: restarting (n of `max_restarts`),
        running (restarted, with its last exit), gave up after its restarts, or stopped."""
        if self.what == "waiting" and (running or self.by_systemd):
            return RunState.restarting(self.last_exit, self.restarts, max_restarts)
        if running and self.by_systemd:  # its unit keeps how the running process's start ended, not the last
            return RunState.up(self.restarts)
        if running:
            return RunState.up(self.restarts, last_exit=self.last_exit)
        if self.what == "gave-up":
            return RunState.gave_up(self.last_exit, self.restarts)
        return RunState(Kind.stopped, self.restarts)


def supervised(ex: Executor, process: Process) -> Supervised | None:
    """What restarts the process says of its ends: its systemd unit, or ucmctl's supervisor's
    last line (in its state file; None before the first end)."""
    if units.managed(process):
        told = units.state(ex, process)
        if told is None:
            return None
        restarts, last_exit, what = told
        return Supervised(restarts, last_exit, what, by_systemd=True)
    if process.restart is None or process.restart.state is None:
        return None
    state = process.restart.state
    done = ex.run(f"cat {shlex.quote(state)} 2>/dev/null || true", timeout=30)
    parts = done.stdout.split()
    if len(parts) != 4 or not all(x.lstrip("-").isdigit() for x in parts[:3]):
        return None
    return Supervised(int(parts[0]), int(parts[1]), parts[3])  # parts[2]: the line's unix time


SIGNALS = ("KILL", "TERM", "STOP", "CONT")  # what `bench --fault` sends: kill -9, a polite stop, a hang


def signal(ex: Executor, process: Process, sig: str, *, spare_leader: bool = False) -> bool:
    """Send `sig` (one of SIGNALS) to the process's group, not waiting for it to end (a fault
    a benchmark injects); whether it was running. Only a group with a marked member is signalled.
    `spare_leader`: every member but the group's leader (ucmctl's supervisor, which then sees
    its server end as the server would on its own)."""
    if sig not in SIGNALS:
        raise ValueError(f"signal {sig!r} is not one of {SIGNALS}")
    pidfile, mark = shlex.quote(process.pidfile), shlex.quote(marker(process))
    if spare_leader:
        send = f"""pids=$(group "$g" | awk -v g="$g" '$1 != g {{print $1}}')
[ -n "$pids" ] || {{ echo absent; exit 0; }}
kill -{sig} $pids 2>/dev/null; echo signalled"""
    else:
        send = f'kill -{sig} -"$g" && echo signalled'
    script = (
        _MEMBERS
        + f"""
[ -s {pidfile} ] || {{ echo absent; exit 0; }}
g=$(cat {pidfile})
case "$g" in *[!0-9]*|''|0|1) echo absent; exit 0 ;; esac
[ "$(members "$g" {mark})" -gt 0 ] || {{ echo absent; exit 0; }}
{send}
"""
    )
    done = ex.run(script, timeout=30)
    if not done.ok:
        raise NodeError(ex.node.name, f"could not signal {process.name}: {done.stderr.strip()}")
    said = done.stdout.split()
    return bool(said) and said[-1] == "signalled"


def log_tail(ex: Executor, process: Process, lines: int = 50) -> str:
    done = ex.run(f"tail -n {int(lines)} {shlex.quote(process.log)} 2>/dev/null", timeout=30)
    return done.stdout
