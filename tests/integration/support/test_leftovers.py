"""The leak report names a process a test started and left running, and nothing that ended."""

from __future__ import annotations

import os
import signal
import subprocess

from tests.support import leftovers


def test_a_detached_process_left_running_is_named_and_one_that_ended_is_not() -> None:
    before = leftovers.pids()
    subprocess.run(["sleep", "0"], check=True)
    # as a daemon leaves its starter: the shell that started it has ended
    left = int(subprocess.run(["sh", "-c", "sleep 37 >/dev/null 2>&1 & echo $!"], capture_output=True,
                              text=True, check=True).stdout)  # fmt: skip
    try:
        found = leftovers.left_behind(before, grace=0.5)
        assert found == {left: "sleep 37"}  # the session's marker is in its environment
    finally:
        os.kill(left, signal.SIGKILL)
    assert leftovers.left_behind(before, grace=1) == {}
