"""One `up` of a deployment at a time on its nodes, whichever machine it comes from.

The control machine's lock (`StateStore.lock`) stops two `up`s from one machine; this guard
stops two machines (or two users, each with their own records) from starting one deployment
twice. Each node runs a small loop that holds an flock on `<run dir>/.up.<node>.lock` as long as
this `up`'s channel to it is open. When `up` ends, or its machine dies, the channel closes,
the loop's next write fails and the kernel drops the lock: nothing stale is left behind.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shlex
import socket
import time
from collections.abc import Iterator

from ucmctl.core.errors import ExitStatus, Problem, UcmctlError
from ucmctl.deploy.preflight import node_problem
from ucmctl.nodes.executor import HELD, Executor, NodeError, Watch
from ucmctl.nodes.fanout import parallel
from ucmctl.plan.model import Plan

# Prints `held` and keeps the lock while it can write; else `busy` and the holder's line, or
# `error` and why. The holder's line is renamed into place, whole; a holder that has just taken
# the lock of a folder no `up` held before has not written it yet: `busy` waits up to a second
# for it. Only the shell holds the lock (fd 9): its `sleep` does not inherit it, so the lock
# goes the moment the shell does (a `sleep` forked as the shell was killed kept it a second more).
_HOLD = """
err=$({{ mkdir -p {run_dir} && : >>{lock}; }} 2>&1) || {{ echo error; echo "$err"; exit 0; }}
command -v flock >/dev/null 2>&1 || {{ echo error; echo "flock is not installed (util-linux)"; exit 0; }}
exec 9>>{lock}
flock -n 9 || {{
  echo busy; i=0
  while [ ! -s {owner} ] && [ $i -lt 20 ]; do sleep 0.05; i=$((i + 1)); done
  cat {owner} 2>/dev/null; exit 0
}}
printf '%s\\n' {who} > {owner}.$$ && mv -f {owner}.$$ {owner}
echo {held}
while echo .; do sleep 1 9>&-; done
"""


def hold_script(run_dir: str, node: str, who: str) -> str:
    """The shell that takes `node`'s lock for the deployment whose run folder is `run_dir`.

    One file per node: nodes whose workdir is on one shared filesystem then lock distinct
    files, so one `up` never finds its own lock taken (flock works over NFS too)."""
    lock = posixpath.join(run_dir, f".up.{node}.lock")
    owner = posixpath.join(run_dir, f".up.{node}.owner")
    return _HOLD.format(
        run_dir=shlex.quote(run_dir),
        lock=shlex.quote(lock),
        owner=shlex.quote(owner),
        who=shlex.quote(who),
        held=HELD,
    )


def _who() -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    return f"`ucmctl up` from {socket.gethostname()} (pid {os.getpid()}, since {since})"


def _ended_here(holder: list[str]) -> bool:
    """Whether the holder's line (`_who`) names an `up` of this machine whose process is gone."""
    found = re.search(r" from (\S+) \(pid (\d+), since ", " ".join(holder))
    if found is None or found[1] != socket.gethostname():
        return False
    try:
        os.kill(int(found[2]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@contextlib.contextmanager
def node_guard(plan: Plan, executors: dict[str, Executor]) -> Iterator[None]:
    """Hold every node's lock for this deployment; refuse (BUSY) when another `up` holds one."""
    held: list[Watch] = []
    who = _who()

    def take(node: str) -> tuple[str, list[str] | NodeError]:
        try:
            text, watch = executors[node].hold(hold_script(plan.nodes[node].run_dir, node, who))
        except NodeError as exc:
            return node, exc
        held.append(watch)
        return node, text.splitlines()

    def take_once_gone(node: str) -> tuple[str, list[str] | NodeError]:
        """`take`, and again for a few seconds while the holder is an `up` of this machine that
        has ended: its node loop lets go at its next write, up to a second (more under load)
        after that `up`'s channel closed."""
        deadline = time.monotonic() + 5
        while True:
            node, answer = take(node)
            if isinstance(answer, NodeError) or answer[:1] != ["busy"] or time.monotonic() > deadline:
                return node, answer
            if not _ended_here(answer[1:]):
                return node, answer
            time.sleep(0.2)

    try:
        # The first node in name order is taken alone, before the others: two `up`s from two
        # control machines meet there first, so one of them wins the whole set (taken all at
        # once, each could win some nodes and both would be refused).
        first, *rest = sorted(executors)
        answers = [take_once_gone(first)]
        if isinstance(answers[0][1], NodeError) or answers[0][1][:1] != ["busy"]:
            answers += parallel(rest, take_once_gone)
        unreachable = [(node, err) for node, err in answers if isinstance(err, NodeError)]
        if unreachable:  # as preflight says it, every such node at once
            raise UcmctlError(
                [Problem(node_problem(plan.nodes[node], err)) for node, err in unreachable],
                status=ExitStatus.NOT_READY,
            )
        for node, lines in answers:
            assert not isinstance(lines, NodeError)
            if lines[:1] == ["busy"]:
                holder = next((line for line in lines[1:] if line.strip()), "another `ucmctl up`")
                raise UcmctlError.one(
                    f"deployment '{plan.deployment}' is being started on node {node} by {holder}",
                    fix="wait for that `up` to finish (then `ucmctl status`), or stop it",
                    status=ExitStatus.BUSY,
                )
            if HELD not in lines:
                why = " ".join(line.strip() for line in lines[1:] if line.strip()) or "no answer"
                raise UcmctlError.one(
                    f"node {node}: cannot lock {plan.nodes[node].run_dir}/.up.{node}.lock: {why}",
                    status=ExitStatus.NOT_READY,
                )
        yield
    finally:
        for watch in held:
            watch.close()
