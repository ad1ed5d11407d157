"""Start real server processes for tests: free loopback ports, health waits, group kills."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def alive(pid: int) -> bool:
    """A zombie counts as gone: PID 1 here does not reap orphans."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(check: Callable[[], T], timeout: float = 15, every: float = 0.05) -> T:
    """`check()` again every `every` s until it is true or `timeout` s pass (once more at the
    end); its last value. The tests' one wait for a condition."""
    deadline = time.monotonic() + timeout
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(every)
    return value if value or time.monotonic() < deadline else check()


def carries_marker(pid: int, text: bytes) -> bool:
    """Whether a live (not zombie) process has a UCMCTL_PROCESS marker containing `text`."""
    with contextlib.suppress(OSError):
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z" and any(e.startswith(b"UCMCTL_PROCESS=") and text in e for e in env)
    return False


def in_the_kernel() -> str:
    """Every process of the machine waiting uninterruptibly (state D), with where it waits and its
    kernel stack where readable: what to show when a stop outlived its timeout."""
    out = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit() and (stat := (d / "stat").read_text()).rsplit(")", 1)[1].split()[0] == "D":
                wchan = (d / "wchan").read_text()
                stack = " <- ".join(line.split()[-1] for line in (d / "stack").read_text().splitlines()[:6])
                # its name from stat: reading its cmdline would take the lock it may hold
                out.append(f"pid {d.name} {stat.split()[1]} in {wchan}: {stack}")
    return "\n".join(out) or "no process in state D"


def environ(pid: int) -> dict[str, str]:
    """A process's environment ({} once it is gone)."""
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return dict(e.decode(errors="replace").split("=", 1) for e in raw if b"=" in e)
    return {}


_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(span: int = 1) -> int:
    """The first of `span` consecutive loopback ports free now (a server with
    `servers_per_node: 2` takes its port and the next), none handed out before to a test process
    still alive on this machine. They are below the kernel's ephemeral range: a port from
    bind(0) is one that any outgoing connection may take as its local port before the server
    binds it (a fresh-clone CI lost a prefill's second port so, EADDRINUSE). Two test processes
    side by side (test.sh's lanes, pytest-xdist's workers) could draw the same free port before
    either bound it (a CI run lost a decode's port so): the ports handed out are kept in one
    record for the machine, under a lock. (Not below 20000: Mooncake's transfer engine takes
    RPC ports at random from 15000-17000.)"""
    low = _ephemeral_low()
    rng = random.Random()
    with _port_record() as taken:
        for _ in range(1000):
            base = rng.randrange(20000, max(20001, low - span))
            ports = range(base, base + span)
            if any(p in _HANDED_OUT or p in taken for p in ports) or not all(_bindable(p) for p in ports):
                continue
            _HANDED_OUT.update(ports)
            taken.update(dict.fromkeys(ports, os.getpid()))
            return base
    raise RuntimeError(f"no {span} free loopback ports that were not handed out before")


PORT_RECORD = Path("/tmp/ucmctl-test-ports")  # "port pid" lines, one machine's test processes


@contextlib.contextmanager
def _port_record() -> Iterator[dict[int, int]]:
    """The ports handed out to test processes still alive (port -> pid), changed in place and
    written back, under the record's lock."""
    with open(f"{PORT_RECORD}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        taken: dict[int, int] = {}
        with contextlib.suppress(FileNotFoundError):
            for line in PORT_RECORD.read_text().split("\n"):
                port, _, pid = line.partition(" ")
                if port.isdigit() and pid.isdigit() and alive(int(pid)):
                    taken[int(port)] = int(pid)
        yield taken
        tmp = PORT_RECORD.with_name(f"{PORT_RECORD.name}.{os.getpid()}")
        tmp.write_text("".join(f"{port} {pid}\n" for port, pid in taken.items()))
        tmp.replace(PORT_RECORD)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float) -> float:
    """Seconds until GET url answers 200; raises if the process dies or time runs out."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before {url} answered")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as r:
            if r.status == 200:
                return time.monotonic() - start
        time.sleep(0.05)
    raise TimeoutError(f"{url} not healthy within {timeout} s")


@contextlib.contextmanager
def sim_server(tmp: Path, *flags: str, model: str = "sim-model", timeout: float = 30) -> Iterator[Server]:
    """One `ucmctl sim serve` on a free loopback port, killed (whole group) afterwards."""
    port = free_port()
    log = tmp / f"sim-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "ucmctl",
        "sim",
        "serve",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *flags,
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)  # fmt: skip
    server = Server(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_healthy(f"{server.url}/health", process, timeout)
        yield server
    except Exception:
        print(server.log_tail())
        raise
    finally:
        server.kill()
