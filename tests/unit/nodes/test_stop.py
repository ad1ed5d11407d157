"""`down`'s stop of one process for real (lifecycle.stop on this machine): TERM to its group,
then, for a process that ignores TERM, KILL once `grace` seconds have passed by the clock."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from tests.support.processes import wait_for
from ucmctl.nodes import lifecycle
from ucmctl.nodes.executor import LocalExecutor
from ucmctl.plan.model import NodePlan, PlacedFile, Process, Stage


def _started(tmp: Path, script: str) -> tuple[LocalExecutor, Process]:
    home = tmp / "srv"
    home.mkdir()
    launch = home / "launch.sh"
    launch.write_text(script)
    node = NodePlan(name="local", host="localhost", transport="local", user="me", ssh_port=22,
                    key=None, platform="cpu", devices=0, python="python3", run_dir=str(tmp),
                    bind="127.0.0.1")  # fmt: skip
    p = Process(name="srv", role="decode", node="local", stage=Stage.servers, argv=["true"], env={},
                launch=str(launch), files=[PlacedFile(path=str(launch), content="")], ports={},
                log=str(home / "output.log"), pidfile=str(home / "pid"), health_timeout=60.0)  # fmt: skip
    ex = LocalExecutor(node)
    lifecycle.start(ex, p)
    assert wait_for(lambda: (home / "output.log").exists() and "up" in (home / "output.log").read_text())
    return ex, p


def test_a_process_that_ignores_term_is_killed_after_the_grace(tmp_path: Path) -> None:
    ex, p = _started(tmp_path, "trap '' TERM\necho up\nwhile :; do sleep 0.1; done\n")
    t0 = time.monotonic()
    stopped = lifecycle.stop(ex, p, grace=1)
    took = time.monotonic() - t0
    assert stopped.was_running and stopped.killed, stopped
    assert 1.0 <= took < 7.0, took  # the grace by the clock, then the KILL
    assert lifecycle.alive(ex, p) is None


def test_a_process_that_ends_on_term_is_stopped_not_killed(tmp_path: Path) -> None:
    ex, p = _started(tmp_path, "echo up\nexec sleep 60\n")
    stopped = lifecycle.stop(ex, p, grace=5)
    assert stopped.was_running and not stopped.killed
    assert lifecycle.stop(ex, p, grace=5).was_running is False  # gone: nothing to stop


class _HangingReads(LocalExecutor):
    """This machine, where reading a process's environment hangs (as it does for a process stuck
    in the kernel holding its memory map's lock): `grep` first on PATH sleeps instead."""

    def __init__(self, node: NodePlan, bin_dir: Path) -> None:
        super().__init__(node)
        self.bin_dir = bin_dir

    def argv(self, command: str) -> list[str]:
        return ["/bin/sh", "-c", f'PATH="{self.bin_dir}:$PATH"\n{command}']


def test_a_process_whose_environment_cannot_be_read_is_still_stopped_in_time(tmp_path: Path) -> None:
    ex, p = _started(tmp_path, "echo up\nexec sleep 60\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "grep").write_text("#!/bin/sh\nexec sleep 60\n")
    (fake / "grep").chmod(0o755)
    t0 = time.monotonic()
    stopped = lifecycle.stop(_HangingReads(ex.node, fake), p, grace=5)
    took = time.monotonic() - t0
    assert stopped.was_running and not stopped.killed, stopped  # counted alive, then gone on TERM
    assert 3.0 <= took < 12.0, took  # one read given up after 3 s, not the command's timeout
    assert lifecycle.alive(ex, p) is None


def test_the_shell_functions_name_a_groups_live_members(tmp_path: Path) -> None:
    """`members` counts the group's processes that carry the marker, `stuck` names each with its
    state and kernel wait (what `down` says of a process that outlived KILL), and neither reads
    another group."""
    ex, p = _started(tmp_path, "echo up\nsleep 60 &\nexec sleep 61\n")
    group = Path(p.pidfile).read_text().strip()
    said = f'echo "$(members {group} "$1")"; echo "$(stuck {group})"; echo "$(stuck 999999999)"'
    done = ex.run(f"set -- {shlex.quote(lifecycle.marker(p))}\n{lifecycle._MEMBERS}{said}", timeout=30)
    counted, named, other = done.stdout.split("\n")[:3]
    assert counted.strip() == "2", done  # the launch script's shell became `sleep 61`, and its child
    assert len(named.split(" pid ")) == 3 and all("(S" in part for part in named.split(" pid ")[1:]), named
    assert other == ""
    lifecycle.stop(ex, p, grace=5)
