"""`lifecycle.signal` (what `bench --fault` sends): the named signal reaches the process's group
on this machine, and a pidfile whose group carries no marker of the process is never signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ucmctl.nodes import lifecycle
from ucmctl.nodes.executor import LocalExecutor
from ucmctl.plan.model import NodePlan, PlacedFile, Process, Stage


def _process(tmp: Path, script: str) -> tuple[LocalExecutor, Process]:
    home = tmp / "srv"
    home.mkdir()
    (home / "launch.sh").write_text(script)
    node = NodePlan(name="local", host="localhost", transport="local", user="me", ssh_port=22,
                    key=None, platform="cpu", devices=0, python="python3", run_dir=str(tmp),
                    bind="127.0.0.1")  # fmt: skip
    launch = str(home / "launch.sh")
    p = Process(name="srv", role="mixed", node="local", stage=Stage.servers, argv=["true"], env={},
                launch=launch, files=[PlacedFile(path=launch, content=script)], ports={},
                log=str(home / "output.log"), pidfile=str(home / "pid"), health_timeout=60.0)  # fmt: skip
    return LocalExecutor(node), p


def _gone(ex: LocalExecutor, p: Process, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if lifecycle.alive(ex, p) is None:
            return True
        time.sleep(0.05)
    return False


def _quiet(pid: int) -> bool:
    """`pid` sleeps with no signal pending (a SIGKILL sent to it is pending until it dies)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    return status["State"].startswith("S") and int(status["SigPnd"], 16) == int(status["ShdPnd"], 16) == 0


@pytest.mark.parametrize(("sig", "said"), [("TERM", "term"), ("KILL", None)])
def test_the_signal_reaches_the_group(tmp_path: Path, sig: str, said: str | None) -> None:
    caught = tmp_path / "caught"
    ex, p = _process(tmp_path, f"trap 'echo term > {caught}; exit 0' TERM\nwhile :; do sleep 0.1; done\n")
    lifecycle.start(ex, p)
    try:
        assert lifecycle.signal(ex, p, sig) is True
        assert _gone(ex, p)
        assert (caught.read_text().strip() if caught.exists() else None) == said
        assert lifecycle.signal(ex, p, sig) is False  # nothing runs now: nothing is sent
    finally:
        lifecycle.stop(ex, p, grace=1)


def test_a_group_without_the_marker_is_not_signalled(tmp_path: Path) -> None:
    ex, p = _process(tmp_path, "exec sleep 30\n")
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)  # not the process: no marker
    try:
        Path(p.pidfile).write_text(f"{other.pid}\n")
        deadline = time.monotonic() + 5
        while not _quiet(other.pid) and time.monotonic() < deadline:  # it runs `sleep` now
            time.sleep(0.01)
        assert lifecycle.signal(ex, p, "KILL") is False
        assert _quiet(other.pid)  # no KILL pending, nor dying of one: none was sent
        assert other.poll() is None
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()


def test_only_the_signals_of_a_fault(tmp_path: Path) -> None:
    ex, p = _process(tmp_path, "exec sleep 30\n")
    with pytest.raises(ValueError):
        lifecycle.signal(ex, p, "STOP; rm -rf ~")


def test_sparing_the_leader_signals_every_other_member(tmp_path: Path) -> None:
    """What a supervised server's fault sends: the group's members but its leader (the
    supervisor), which lives on and sees its child die."""
    ex, p = _process(tmp_path, f"sleep 30 &\necho $! > {tmp_path / 'child'}\nwait\nsleep 30\n")
    lifecycle.start(ex, p)
    try:
        deadline = time.monotonic() + 5
        while not (tmp_path / "child").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        child, leader = int((tmp_path / "child").read_text()), int(Path(p.pidfile).read_text())
        assert lifecycle.signal(ex, p, "KILL", spare_leader=True) is True
        deadline = time.monotonic() + 5
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not Path(f"/proc/{child}").exists()  # the child is gone (reaped by its leader)
        assert lifecycle.alive(ex, p) is not None and Path(f"/proc/{leader}").exists()
    finally:
        lifecycle.stop(ex, p, grace=1)
