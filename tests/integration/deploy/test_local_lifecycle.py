"""`up` / `status` / `down` on this machine (local transport, simulator): workdirs full of
regular-expression characters, and `up`s of one deployment racing each other."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.processes import carries_marker, free_port

pytestmark = pytest.mark.slow

# Every character a path may hold that a regex, a glob or a word split would misread.
ODD_WORKDIR = "run[1] *.? \\x (a+b)|c$ ^d"


def topology(tmp: Path, name: str, workdir: Path, decode: str = "", prefill: str = "") -> Path:
    """A 1P1D of the simulator on this machine; `decode` and `prefill` add keys to the sides."""
    path = tmp / f"{name}.yaml"
    path.write_text(
        f"""
name: {name}
mode: centralized
engine: sim
model: {{path: sim-model}}
nodes:
  me: {{host: 127.0.0.1, transport: local, platform: cpu, python: {sys.executable},
        workdir: {json.dumps(str(workdir))}}}
storage: {{storage_backends: {json.dumps(str(workdir / "store"))}, cache_buffer_capacity_gb: 0.25}}
prefill: {{nodes: [me], port: {free_port(4)}{", " + prefill if prefill else ""}}}
decode: {{nodes: [me], port: {free_port(4)}{", " + decode if decode else ""}}}
proxy: {{node: me, port: {free_port()}}}
"""
    )
    return path


@contextlib.contextmanager
def deployed(home: Path, topo: Path, workdir: Path) -> Iterator[None]:
    """`up` of `topo`, then `down` and SIGKILL to anything of `workdir` left."""
    up = ucmctl(home, "up", str(topo))
    assert up.returncode == 0, up.stderr
    try:
        yield
    finally:
        ucmctl(home, "down")
        for pid in processes_of(workdir):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)


def ucmctl(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return Cli(home)(*args, timeout=timeout)


def spawn(home: Path, *args: str) -> subprocess.Popen[str]:
    return Cli(home).popen(*args)


def processes_of(run_dir: Path) -> list[int]:
    """Live processes whose ucmctl marker names a launch script under `run_dir`."""
    mark = f"@{run_dir}/".encode()
    return [
        int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and carries_marker(int(e.name), mark)
    ]


@pytest.fixture(autouse=True)
def nothing_left(tmp_path: Path) -> Iterator[None]:
    """A test that failed before its `down` must not leave its deployment running."""
    yield
    for pid in processes_of(tmp_path):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)


def test_odd_workdir_up_status_down_stop_everything(tmp_path: Path) -> None:
    workdir = tmp_path / ODD_WORKDIR
    topo = topology(tmp_path, "t-odd", workdir, decode="restart: on-failure")  # decode: supervise.sh
    home = tmp_path / "home"
    up = ucmctl(home, "up", str(topo))
    assert up.returncode == 0, up.stderr
    run_dir = workdir / "t-odd"
    assert len(processes_of(run_dir)) >= 3  # prefill, decode and proxy (each may have children)

    status = ucmctl(home, "status", "t-odd")
    assert status.returncode == 0
    assert status.stdout.count("running") == 3, status.stdout

    down = ucmctl(home, "down", "t-odd")
    assert down.returncode == 0, down.stderr
    assert "3 processes stopped" in down.stdout, down.stdout
    assert processes_of(run_dir) == []

    # the record lost: `down TOPOLOGY` finds the processes by their pidfiles and markers, those
    # a scale added too (the topology does not name them)
    assert ucmctl(home, "up", str(topo)).returncode == 0
    scaled = ucmctl(home, "scale", "--decode", "2")
    assert scaled.returncode == 0 and scaled.stdout.strip() == "added decode-1", scaled.stderr
    (home / "deployments" / "t-odd.json").unlink()
    down = ucmctl(home, "down", str(topo))
    assert down.returncode == 0 and "3 processes stopped" in down.stdout, down.stdout
    assert "stopped a process of t-odd not in its plan: decode-1 on me" in down.stderr, down.stderr
    assert processes_of(run_dir) == []


def test_a_failed_up_in_an_odd_workdir_leaves_nothing(tmp_path: Path) -> None:
    workdir = tmp_path / ODD_WORKDIR
    topo = topology(tmp_path, "t-oddfail", workdir)
    # the simulator refuses this and exits, after prefill came up: up's clean-up must stop prefill
    refused = "decode: {nodes: [me], flags: {max-num-seqs: 0}, "
    topo.write_text(topo.read_text().replace("decode: {nodes: [me], ", refused))
    up = ucmctl(tmp_path / "home", "up", str(topo))
    assert up.returncode == 1, up.stderr
    assert "--max-num-seqs must be at least 1" in up.stderr
    assert "stopped everything this `up` started" in up.stderr
    assert processes_of(workdir / "t-oddfail") == []


def test_five_ups_at_once_one_wins(tmp_path: Path) -> None:
    """One control machine: its lock lets exactly one through; the others touch nothing."""
    workdir = tmp_path / "work"
    topo = topology(tmp_path, "t-race", workdir)
    home = tmp_path / "home"
    racers = [spawn(home, "up", str(topo)) for _ in range(5)]
    results = [(p.wait(timeout=180), *p.communicate()) for p in racers]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 4, 4, 4, 4], [(c, err) for c, _, err in results]
    for code, _, err in results:
        if code == 4:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and "deployment 't-race' is busy: `ucmctl up` (pid" in lines[0], err
    run_dir = workdir / "t-race"
    assert len(processes_of(run_dir)) >= 3
    down = ucmctl(home, "down", "t-race")
    assert down.returncode == 0 and "3 processes stopped" in down.stdout, down.stdout
    assert processes_of(run_dir) == []


def test_ups_from_two_control_machines_one_wins(tmp_path: Path) -> None:
    """Separate records (two machines, two users): the nodes' own lock decides."""
    workdir = tmp_path / "work"
    topo = topology(tmp_path, "t-race2", workdir)
    homes = [tmp_path / f"home{i}" for i in range(3)]
    racers = [spawn(home, "up", str(topo)) for home in homes]
    results = [(p.wait(timeout=180), *p.communicate()) for p in racers]
    winners = [i for i, (code, _, _) in enumerate(results) if code == 0]
    assert len(winners) == 1, [(c, err) for c, _, err in results]
    for code, _, err in results:
        if code != 0:
            # the lock of the node, or (the winner already done) its running processes
            errors = [line for line in err.splitlines() if line.startswith("error:")]
            assert code in (3, 4) and len(errors) == 1, (code, err)
            assert "is being started on node me by `ucmctl up` from" in err or "already runs" in err, err
    run_dir = workdir / "t-race2"
    assert len(processes_of(run_dir)) >= 3
    down = ucmctl(homes[winners[0]], "down", "t-race2")
    assert down.returncode == 0 and "3 processes stopped" in down.stdout, down.stdout
    assert processes_of(run_dir) == []
