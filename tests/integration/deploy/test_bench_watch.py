"""`ucmctl bench` watches the deployment it loads (local transport, simulator): a server killed
with SIGKILL mid-phase is reported as one line within 10 s, recorded in the saved result with its
last log lines beside it, `bench compare` refuses to gate on that phase, and `--fail-fast` stops
the run at once; `status --watch` shows the kill at its next look."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import yaml

from tests.integration.deploy.test_local_lifecycle import deployed, spawn, topology, ucmctl
from tests.support.openai_checks import counter
from tests.support.processes import wait_for

pytestmark = pytest.mark.slow

BENCH = [
    "bench",
    "--prefix-ratio",
    "0",
    "--input-len",
    "64",
    "--output-len",
    "8",
    "--num-prompts",
    "80",
    "--request-rate",
    "4",
    "-q",
]  # fmt: skip  (a 20 s phase)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A 1P1D of the simulator on this machine: (its state folder, its work folder)."""
    home, workdir = tmp_path / "home", tmp_path / "work"
    with deployed(home, topology(tmp_path, "t-watch", workdir), workdir):
        yield home, workdir


def timed_lines(stream: IO[str] | None) -> list[tuple[float, str]]:
    """The stream's lines as they come, each with when it came (filled by a thread)."""
    assert stream is not None
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in stream:
            lines.append((time.monotonic(), line.rstrip("\n")))

    threading.Thread(target=read, daemon=True).start()
    return lines


def kill_decode_mid_run(workdir: Path, run: subprocess.Popen[str]) -> float:
    """SIGKILL to decode-0's process group once the phase is under way (it has finished four
    requests); when it was sent."""
    (pidfile,) = workdir.rglob("decode-0/pid")
    topo = yaml.safe_load((workdir.parent / "t-watch.yaml").read_text())
    decode = f"http://127.0.0.1:{topo['decode']['port']}"
    assert wait_for(lambda: counter(decode, "vllm:request_success_total") >= 4, timeout=120)
    assert run.poll() is None, "the run ended before the kill"
    os.killpg(os.getpgid(int(pidfile.read_text())), signal.SIGKILL)
    return time.monotonic()


def test_a_server_killed_mid_phase_is_reported_recorded_and_refused_by_compare(
    tmp_path: Path, deployment: tuple[Path, Path]
) -> None:
    home, workdir = deployment
    save = tmp_path / "results" / "run.json"
    save.parent.mkdir()
    run = spawn(home, *BENCH, "--save", str(save))
    lines = timed_lines(run.stderr)
    killed = kill_decode_mid_run(workdir, run)
    assert run.stdout is not None
    out = run.stdout.read()  # stderr is the reader thread's alone (communicate would race it)
    run.wait(timeout=300)
    # The run went on without it: the requests decode-0 would have served failed (exit 6).
    assert run.returncode == 6, (out, lines)
    said = [(t, line) for t, line in lines if line.startswith("LOST ")]
    assert len(said) == 1, lines
    t, line = said[0]
    assert line.startswith("LOST decode-0 on me: not running, "), line
    assert line.endswith(" s into measure 64 tokens"), line
    assert t - killed <= 10, f"reported {t - killed:.1f} s after the kill"
    into = float(line.split(", ")[1].split(" s into")[0])
    assert into <= 15, line
    (cell,) = json.loads(save.read_text())["cells"]
    (lost,) = cell["measure"]["lost"]
    assert (lost["process"], lost["node"], lost["how"], lost["phase"]) == (
        "decode-0",
        "me",
        "not running",
        "measure 64 tokens",
    )
    assert "measure 64: lost decode-0 on me (not running, " in out
    tail = (save.parent / "run.lost-decode-0.log").read_text()
    assert tail.startswith(f"# {line}\n") and "INFO sim: serving sim-model" in tail, tail  # its own log
    # The gate will not judge a phase that ran without one of its servers, unless told to.
    refused = ucmctl(home, "bench", "compare", str(save), str(save))
    assert refused.returncode == 2
    assert "run/64: its measure phase lost decode-0 on me (not running)" in refused.stderr
    assert "--allow-lost" in refused.stderr
    allowed = ucmctl(home, "bench", "compare", str(save), str(save), "--allow-lost")
    assert allowed.returncode == 0, allowed.stderr


def test_fail_fast_stops_the_run_at_once(tmp_path: Path, deployment: tuple[Path, Path]) -> None:
    home, workdir = deployment
    run = spawn(home, *BENCH, "--fail-fast")
    lines = timed_lines(run.stderr)
    killed = kill_decode_mid_run(workdir, run)
    run.wait(timeout=60)
    ended = time.monotonic()
    assert run.returncode == 1, lines
    assert ended - killed <= 10, f"stopped {ended - killed:.1f} s after the kill"
    text = "\n".join(line for _, line in lines)
    assert "stopped at once (--fail-fast): LOST decode-0 on me: not running" in text, text
    assert "Traceback" not in text


def test_status_watch_shows_a_kill_at_the_next_look(tmp_path: Path, deployment: tuple[Path, Path]) -> None:
    home, workdir = deployment
    env = {**os.environ, "UCMCTL_HOME": str(home), "COLUMNS": "80"}
    said = (tmp_path / "stderr").open("w")  # a file: a pipe nobody reads could fill and block it
    # Ctrl-C as a terminal sends it: a run started in the background (`.ci/run &`) hands its
    # children SIGINT ignored, and Python then keeps it ignored.
    watch = subprocess.Popen([sys.executable, "-m", "ucmctl", "status", "--watch", "--interval", "1"],
                             stdout=subprocess.PIPE, stderr=said, text=True, env=env,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    lines = timed_lines(watch.stdout)
    try:
        assert wait_for(
            lambda: any("decode-0" in line and "healthy" in line for _, line in lines), timeout=30
        )
        (pidfile,) = workdir.rglob("decode-0/pid")
        os.killpg(os.getpgid(int(pidfile.read_text())), signal.SIGKILL)
        killed = time.monotonic()
        assert wait_for(
            lambda: any(t > killed and "decode-0" in x and "not running" in x for t, x in lines), timeout=10
        )
    finally:
        watch.send_signal(signal.SIGINT)
        watch.wait(timeout=60)
        said.close()
    assert watch.returncode == 130, (tmp_path / "stderr").read_text()
    frames = [line for _, line in lines if line.startswith("--- ")]
    assert len(frames) >= 2, lines  # a look every second, each under its time
    assert max(len(line) for _, line in lines) <= 80, [line for _, line in lines if len(line) > 80]
