"""One `up` of a deployment at a time: this machine's lock (StateStore.lock) and the nodes' lock
(deploy/guard.py), with real processes holding them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.processes import wait_for
from ucmctl.core.errors import ExitStatus, UcmctlError
from ucmctl.deploy.guard import hold_script, node_guard
from ucmctl.deploy.state import StateStore
from ucmctl.nodes.executor import LocalExecutor
from ucmctl.plan.model import NodePlan, Plan

HOLDER = """
import sys
import threading
from pathlib import Path
from ucmctl.deploy.state import StateStore
with StateStore(Path(sys.argv[1])).lock("t-lock", "up"):
    print("locked", flush=True)
    sys.stdin.read()
"""


def holder(root: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline() == "locked\n"
    return p


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    p = holder(tmp_path)
    try:
        with pytest.raises(UcmctlError) as caught, StateStore(tmp_path).lock("t-lock", "down"):
            pass
        assert caught.value.status is ExitStatus.BUSY
        text = str(caught.value)
        assert "deployment 't-lock' is busy: `ucmctl up` (pid " in text and f"pid {p.pid} " in text
        assert "\n" not in text
    finally:
        p.kill()
        p.wait()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    p = holder(tmp_path)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    store = StateStore(tmp_path)
    with (
        store.lock("t-lock", "up"),  # the kernel dropped the flock with the process
        pytest.raises(UcmctlError, match=f"pid {os.getpid()} "),
        store.lock("t-lock", "up"),  # one holder, even within one process
    ):
        pass
    with StateStore(tmp_path).lock("t-lock", "up"):  # released at exit
        pass


def test_lock_names_are_checked(tmp_path: Path) -> None:
    with pytest.raises(UcmctlError, match="not a deployment name"), StateStore(tmp_path).lock("../x", "up"):
        pass


def plan(run_dir: Path) -> Plan:
    node = NodePlan(name="n1", host="localhost", transport="local", user="me", ssh_port=22, key=None,
                    platform="cpu", devices=0, python="python3", run_dir=str(run_dir),
                    bind="127.0.0.1")  # fmt: skip
    return Plan(
        deployment="t-guard",
        mode="mixed",
        engine="sim",
        topology_digest="x",
        nodes={"n1": node},
        processes=[],
    )


def test_node_guard_refuses_a_second_up_and_frees_the_node_after(tmp_path: Path) -> None:
    run_dir = tmp_path / "run[1] *.\\ x"
    p = plan(run_dir)
    ex = LocalExecutor(p.nodes["n1"])
    with node_guard(p, {"n1": ex}):
        assert (run_dir / ".up.n1.lock").exists()
        with pytest.raises(UcmctlError) as caught, node_guard(p, {"n1": ex}):
            pass
        assert caught.value.status is ExitStatus.BUSY
        text = str(caught.value)
        assert text.startswith("deployment 't-guard' is being started on node n1 by `ucmctl up` from ")
        assert f"(pid {os.getpid()}, since " in text and "\n" not in text
    with node_guard(p, {"n1": ex}):  # released when the first guard ended
        pass


def test_the_node_lock_goes_when_its_holder_dies(tmp_path: Path) -> None:
    """A control machine that dies mid-`up` (here: the loop killed) does not lock the node."""
    p = plan(tmp_path / "run")
    ex = LocalExecutor(p.nodes["n1"])
    text, watch = ex.hold(hold_script(str(tmp_path / "run"), "n1", "first"))
    assert text.splitlines()[0] == "held"
    assert ex.hold(hold_script(str(tmp_path / "run"), "n1", "second"))[0].splitlines()[:2] == [
        "busy",
        "first",
    ]
    watch.close()
    deadline = time.monotonic() + 5
    while True:
        text, again = ex.hold(hold_script(str(tmp_path / "run"), "n1", "third"))
        again.close()
        if text.startswith("held") or time.monotonic() > deadline:
            break
    assert text.splitlines()[0] == "held"


def test_a_node_where_the_lock_cannot_be_made_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    p = plan(blocker / "run")  # a folder inside a regular file
    with pytest.raises(UcmctlError) as caught, node_guard(p, {"n1": LocalExecutor(p.nodes["n1"])}):
        pass
    assert caught.value.status is ExitStatus.NOT_READY
    assert "node n1: cannot lock" in str(caught.value) and "Not a directory" in str(caught.value)


def test_an_up_right_after_an_ended_one_waits_for_its_node_loop_to_let_go(tmp_path: Path) -> None:
    """The node loop of an ended `up` of this machine holds the lock until its next write (up to a
    second, more under load): the next `up` waits for it rather than saying the node is busy. A
    holder that still runs is refused at once, as before."""
    p = plan(tmp_path / "run")
    ex = LocalExecutor(p.nodes["n1"])
    ended = f"`ucmctl up` from {socket.gethostname()} (pid 999999999, since 2026-12-02 10:00:00)"
    _, watch = ex.hold(hold_script(str(tmp_path / "run"), "n1", ended))
    threading.Timer(1.5, watch.close).start()  # its loop lets go 1.5 s from now
    started = time.monotonic()
    with node_guard(p, {"n1": ex}):
        waited = time.monotonic() - started
    assert 1.0 < waited < 5.0
    alive = f"`ucmctl up` from {socket.gethostname()} (pid {os.getpid()}, since 2026-12-02 10:00:00)"
    _, watch = ex.hold(hold_script(str(tmp_path / "run"), "n1", alive))
    started = time.monotonic()
    with pytest.raises(UcmctlError) as caught, node_guard(p, {"n1": ex}):
        pass
    watch.close()
    assert caught.value.status is ExitStatus.BUSY and time.monotonic() - started < 4.0  # not the 5 s wait


def test_a_holder_that_has_not_written_its_line_yet_is_named_once_it_has(tmp_path: Path) -> None:
    """Three `up`s racing for a folder no `up` held before: the lock's winner writes its line just
    after it takes the lock, and the losers name it rather than "another `ucmctl up`"."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock, owner = run_dir / ".up.me.lock", run_dir / ".up.me.owner"
    # The lock taken, its line written 0.3 s later (renamed into place, as the hold script does).
    later = f"exec 9>>{lock}; flock 9; sleep 0.3; echo 'the winner' >{owner}.x; mv {owner}.x {owner}; sleep 5"
    winner = subprocess.Popen(["sh", "-c", later], start_new_session=True)
    try:
        assert wait_for(lambda: subprocess.run(["flock", "-n", str(lock), "true"]).returncode != 0)
        assert not owner.exists()
        hold = hold_script(str(run_dir), "me", "the loser")
        loser = subprocess.run(["sh", "-c", hold], capture_output=True, text=True, timeout=10)
        assert loser.stdout.splitlines() == ["busy", "the winner"]
    finally:
        os.killpg(winner.pid, signal.SIGKILL)
        winner.wait()
