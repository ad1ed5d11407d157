"""What a test module leaves running: the processes of the tests (started from this test session,
or by ucmctl, or a daemon the tests run) that began while the module ran and are still alive (not
zombies) once its fixtures are torn down, with their command lines. The session's summary lists
them per module, so a test that leaks a server, a mount client or a daemon is named, rather than
slowing or breaking the modules after it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.support.netns import MADE_HERE
from tests.support.processes import alive, environ

# In the environment of every process this session starts on this machine (inherited).
SESSION = "UCMCTL_TEST_SESSION"
DAEMONS = ("glusterd", "glusterfs", "slurmctld", "slurmd", "munged", "dockerd", "containerd", "conmon",
           "mooncake_master", "vllm", "ucmctl", "sshd")  # fmt: skip


def pids() -> set[int]:
    return {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _netns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def of_the_tests(pid: int, line: str) -> bool:
    if "-m pytest" in line or line.split(" ", 1)[0].endswith("pytest"):
        return False  # a test session (the other CI lane's next step), not what a test left
    env = environ(pid)
    if SESSION in env:  # started on this machine by a test session: this one, or another's
        return env[SESSION] == os.environ.get(SESSION)
    netns = _netns(pid)
    if netns in MADE_HERE:  # on one of this process's test hosts
        return True
    if netns != _netns(os.getpid()):
        # On a test host of a test session beside this one (a Slurm job step, an sshd: started
        # without this session's environment), or in a container, whose runtime's processes
        # (conmon, containerd) are on this machine's network and are judged there.
        return False
    return "UCMCTL_PROCESS" in env or any(d in line for d in DAEMONS)


def _ours(pid: int) -> bool:
    """This test process and what it runs now (a child it still waits for is not left behind)."""
    try:
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return True
    return pid == os.getpid() or ppid == os.getpid()


def left_behind(before: set[int], grace: float = 3.0) -> dict[int, str]:
    """Processes not in `before` still alive after `grace` seconds (no wait when there are none)."""
    deadline = time.monotonic() + grace
    while True:
        found = {p: cmdline(p) for p in pids() - before if alive(p) and not _ours(p)}
        found = {p: c for p, c in found.items() if c and of_the_tests(p, c)}  # kernel threads: no cmdline
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)
