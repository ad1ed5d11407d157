"""Plan -> a self-contained `sbatch` script: the deployment as one batch job, for sites where the
machine that runs ucmctl cannot stay attached (`ucmctl render TOPOLOGY --slurm DIR`).

The job is what the live launcher (launch/slurm.py) builds, run from inside the allocation: the
same job name (`ucmctl-<deployment>`, so `ucmctl down TOPOLOGY` finds and cancels it), the same
nodes, each process a job step `srun --overlap ... /bin/sh -c <lifecycle.spawn(...)>` whose task
is the process (its pidfile and marker as `up` writes them, so `down` stops it as it stops a
live one). The script writes every file of the Plan (the run directory is on a filesystem all
nodes share, so writing from the batch node is enough), starts the processes stage by stage,
each stage gated on its processes' health URLs, then holds the allocation until `scancel` or
the time limit (not `wait`: `down` stops each process with a step of this job, which must
outlive the process it stops). A process that fails its health gate, or whose step ends
before, ends the job.

Nothing from the topology reaches the shell unquoted: file contents travel as base64 in quoted
heredocs, every path and word is `shlex.quote`d. `#SBATCH` lines are not shell: their values
(Slurm names, validated by the topology's schema) are checked once more here.
"""

from __future__ import annotations

import base64
import posixpath
import re
import shlex
import textwrap
from pathlib import Path

from ucmctl.core.errors import UcmctlError
from ucmctl.core.words import counted
from ucmctl.launch.slurm import allocation_flags, container_options, slurm_spec
from ucmctl.nodes import lifecycle
from ucmctl.plan.model import Plan, Process, SlurmPlan

HEADER_MARK = "# Rendered by `ucmctl render --slurm`"
HEREDOC_END = "UCMCTL_BASE64_END"  # never a base64 line: it has an underscore
TAIL_LINES = 30  # log lines shown for a process that failed
PROBE_TIMEOUT = 5  # seconds per health request

# What an #SBATCH value may hold: Slurm reads the line itself, without a shell's quoting.
_SBATCH_VALUE = re.compile(r"^[A-Za-z0-9_.:,@%+=/\[\]-]+$")

_PROBE = """\
# probe URL: true when URL answers 200 (no HTTP proxy: the nodes are reached directly)
probe() {
  if [ -n "$CURL" ]; then
    [ "$("$CURL" --noproxy '*' -s -o /dev/null -m %(timeout)d -w '%%{http_code}' "$1")" = 200 ]
  else
    "$PYTHON" -c '
import sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    sys.exit(0 if opener.open(sys.argv[1], timeout=%(timeout)d).status == 200 else 1)
except Exception:
    sys.exit(1)
' "$1"
  fi
}
"""

_GATE = """\
# fail NAME NODE LOG REASON: say why, show the log's end, cancel the whole job
fail() {
  echo "ucmctl: $1 on $2 failed: $4" >&2
  echo "ucmctl: last lines of $3:" >&2
  tail -n %(tail)d "$3" >&2 2>/dev/null
  echo "ucmctl: cancelling job $SLURM_JOB_ID" >&2
  scancel "$SLURM_JOB_ID"
  exit 1
}

# gate NAME NODE PID STARTED TIMEOUT LOG URL...: each URL answers 200, in order, within TIMEOUT
# seconds of STARTED, while the step (srun, PID) runs
gate() {
  g_name=$1 g_node=$2 g_pid=$3 g_deadline=$(($4 + $5)) g_timeout=$5 g_log=$6
  shift 6
  for g_url in "$@"; do
    until probe "$g_url"; do
      kill -0 "$g_pid" 2>/dev/null \\
        || fail "$g_name" "$g_node" "$g_log" "its job step ended before it became healthy"
      [ "$(date +%%s)" -lt "$g_deadline" ] \\
        || fail "$g_name" "$g_node" "$g_log" "$g_url did not answer 200 within $g_timeout s"
      sleep 1
    done
  done
  echo "ucmctl: $g_name on $g_node is healthy"
}
"""


def script_name(plan: Plan) -> str:
    return f"{plan.deployment}.sbatch"


def log_pattern(plan: Plan) -> str:
    """The job's own output (Slurm expands %j): in the folder `sbatch` runs from, where Slurm puts
    a job's output by default; a folder that must exist before the job starts."""
    return f"ucmctl-{plan.deployment}-%j.out"


def _sbatch(flag: str, value: str | bool | None) -> str:
    if value is True:
        return f"#SBATCH --{flag}"
    assert isinstance(value, str)
    if not _SBATCH_VALUE.match(value):
        raise UcmctlError.one(
            f"cannot write #SBATCH --{flag}={value!r}: Slurm reads that line unquoted",
            fix="use a Slurm name (letters, digits, . _ -)",
        )
    return f"#SBATCH --{flag}={value}"


def _header(plan: Plan) -> list[str]:
    spec = slurm_spec(plan)
    job = spec.job_name(plan.deployment)
    about = f"""\
#!/bin/bash
{HEADER_MARK} from topology {plan.deployment} (digest {plan.topology_digest[:12]}).
#
# The deployment as one Slurm batch job: it writes every process's files, starts the processes
# as job steps stage by stage, each stage gated on its health checks, then holds the nodes
# until the job is cancelled or reaches its time limit. If a process fails its health check,
# the job prints which one with the end of its log and cancels itself.
#
#   submit:  sbatch {script_name(plan)}   (the job's output: {log_pattern(plan)}, in the folder
#            sbatch runs from)
#   stop:    scancel --name={job}   or   ucmctl down TOPOLOGY (it finds the job by its name)
#
# Processes ({len(plan.processes)}), their logs under their node's run directory:
"""
    lines = about.splitlines()
    for p in plan.processes:
        lines.append(_comment(f"  {p.name} on {p.node} (stage {p.stage.name}), log {p.log}"))
    if plan.proxy_urls():
        lines.append(_comment(f"Requests go to the {plan.proxy_words().replace(' ', ': ', 1)}"))
    lines.append("#")
    flags = [*allocation_flags(plan), ("output", log_pattern(plan))]
    lines += [_sbatch(flag, value) for flag, value in flags]
    return lines


def _comment(text: str) -> str:
    """One comment line, whatever `text` holds: a newline in it would end the comment."""
    return "# " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _file(path: str, content: str, mode: int) -> list[str]:
    tmp = shlex.quote(f"{path}.sbatch-staging")
    b64 = base64.b64encode(content.encode()).decode()
    body = textwrap.wrap(b64, 76) or [""]
    return [
        f"base64 -d > {tmp} <<'{HEREDOC_END}' || fail_files {shlex.quote(path)}",
        *body,
        HEREDOC_END,
        f"chmod {mode:o} {tmp} && mv -f {tmp} {shlex.quote(path)} || fail_files {shlex.quote(path)}",
    ]


def _files(plan: Plan) -> list[str]:
    files = [f for p in plan.processes for f in p.files]
    dirs = sorted(
        {posixpath.dirname(f.path) for f in files} | {posixpath.dirname(p.log) for p in plan.processes}
    )
    lines = [
        "# --- files: every process's files, base64 (the run directories are shared by all nodes)",
        'fail_files() { echo "ucmctl: cannot write $1" >&2; scancel "$SLURM_JOB_ID"; exit 1; }',
        "mkdir -p -- " + " ".join(shlex.quote(d) for d in dirs) + " || fail_files " + shlex.quote(dirs[0]),
    ]
    for f in files:
        lines += _file(f.path, f.content, f.mode)
    lines.append("# --- end of files")
    return lines


def _step(process: Process, gres: str | None) -> str:
    """The job step whose task is the process, as the live launcher starts it (launch/slurm.py)."""
    argv = [
        "srun",
        "--overlap",
        *([f"--gres={gres}"] if gres else []),
        f"--nodelist={process.node}",
        "--nodes=1",
        "--ntasks=1",
        f"--job-name={process.name}",
        *container_options(process),
        "/bin/sh",
        "-c",
    ]
    spawn = lifecycle.spawn(process, foreground=True)
    return " ".join(shlex.quote(a) for a in [*argv, spawn]) + " </dev/null &"


def _stages(plan: Plan) -> list[str]:
    lines: list[str] = []
    index = {p.name: i for i, p in enumerate(plan.processes)}
    gres = slurm_spec(plan).gres_per_node(plan)
    for stage in plan.stages():
        names = ", ".join(f"{p.name} on {p.node}" for p in stage)
        said = f"stage {stage[0].stage.name}: starting {names}"
        lines += ["", f"# --- {said}", f"echo {shlex.quote(f'ucmctl: {said}')}"]
        for p in stage:
            i = index[p.name]
            lines += [_step(p, gres), f"pid_{i}=$! started_{i}=$(date +%s)"]
        for p in stage:
            i = index[p.name]
            seconds = str(max(1, round(p.health_timeout)))
            quoted = [shlex.quote(w) for w in (p.name, p.node)] + [f'"$pid_{i}"', f'"$started_{i}"']
            quoted += [shlex.quote(w) for w in (seconds, p.log, *p.health)]
            lines.append("gate " + " ".join(quoted))
    return lines


def _tools(plan: Plan) -> list[str]:
    pythons = [n.python for n in plan.nodes.values()]
    candidates = " ".join(shlex.quote(p) for p in dict.fromkeys([*pythons, "python3"]))
    return [
        "CURL=$(command -v curl) PYTHON=",
        'if [ -z "$CURL" ]; then',
        f"  for candidate in {candidates}; do",
        '    if command -v "$candidate" >/dev/null 2>&1; then PYTHON=$candidate; break; fi',
        "  done",
        '  if [ -z "$PYTHON" ]; then',
        '    echo "ucmctl: neither curl nor Python on $(hostname): cannot check health" >&2',
        '    scancel "$SLURM_JOB_ID"; exit 1',
        "  fi",
        "fi",
    ]


def _hold(plan: Plan) -> list[str]:
    """Hold the allocation until `scancel` (`ucmctl down`) or the time limit, never less: `down`
    stops each process with a step of this job, which must outlive the process it stops. A
    process that ends is reported once (the job holds its nodes all the same)."""
    lines = [
        "# hold the allocation until `scancel` (or `ucmctl down`) or the time limit: not `wait`, since",
        "# `ucmctl down` stops each process with a job step that must outlive the process it stops",
    ]
    checks = []
    for i, p in enumerate(plan.processes):
        said = shlex.quote(f"ucmctl: {p.name} on {p.node} ended (its log: {p.log})")
        checks.append(
            f'  if [ -z "${{ended_{i}:-}}" ] && ! kill -0 "$pid_{i}" 2>/dev/null; then '
            f"ended_{i}=1; echo {said}; fi"
        )
    return [*lines, "while :; do", *checks, "  sleep 5", "done"]


def render_script(plan: Plan) -> str:
    """The sbatch script for `plan` (which must carry a Slurm cluster: `plan.cluster`)."""
    if not isinstance(plan.cluster, SlurmPlan):
        raise UcmctlError.one(
            f"deployment '{plan.deployment}' has no Slurm cluster",
            fix="add `cluster: {kind: slurm, partition: ...}` to the topology",
        )
    if plan.cluster.choose_nodes:  # the addresses in every command line come from the allocation
        raise UcmctlError.one(
            "`render --slurm` needs the nodes named: with cluster.choose_nodes their "
            "addresses are known only once Slurm gives them",
            fix="name Slurm's nodes (with `host`), or use `ucmctl up`",
        )
    up = f"ucmctl: deployment {plan.deployment} is up: {counted(len(plan.processes), 'process')}"
    if doors := plan.proxy_words():
        up += f", {doors}"
    body = [
        *_header(plan),
        "",
        "set -u",
        f"echo {shlex.quote(f'ucmctl: deployment {plan.deployment}:')}"
        + ' "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"',
        "",
        *_tools(plan),
        "",
        *(_PROBE % {"timeout": PROBE_TIMEOUT}).splitlines(),
        "",
        *(_GATE % {"tail": TAIL_LINES}).splitlines(),
        "",
        *_files(plan),
        *_stages(plan),
        "",
        f"echo {shlex.quote(up)}",
        *_hold(plan),
    ]
    return "\n".join(body) + "\n"


def write_script(plan: Plan, folder: Path) -> Path:
    """Write `<folder>/<deployment>.sbatch` (mode 0755); returns its path."""
    text = render_script(plan)
    if folder.exists() and not folder.is_dir():
        raise UcmctlError.one(f"--slurm {folder}: not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / script_name(plan)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path
