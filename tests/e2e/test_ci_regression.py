"""The CI regression run, short, on the simulator: deploy the CI suite's topology scenario by
scenario, benchmark it, and compare with the stored baseline (benchmarks/baselines/ci-sim.json).
The same commands gate a real cluster (see benchmarks/ci/)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import Cli

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def ucmctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return Cli(Path(env["UCMCTL_HOME"]), env=env, cwd=ROOT, timeout=600)(*args)


def suite_and_gate(tmp_path: Path, env: dict[str, str], tag: str) -> subprocess.CompletedProcess[str]:
    """The CI suite, fresh, then the gate against the stored baseline: `bench compare`'s run."""
    new = tmp_path / f"new-{tag}.json"
    run = ucmctl("bench", "suite", "benchmarks/suites/ci.yaml", "--results", str(tmp_path / f"r-{tag}.jsonl"),
                 "--fresh", "--save", str(new), env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr
    cells = json.loads(new.read_text())["cells"]
    assert len(cells) == 6  # 2 input lengths x 3 scenarios
    # Simulated time is steady, but a busy CI machine still stretches it a little; a real
    # cluster uses tight limits with --repeats (benchmarks/ci/). A 2x slowdown fails this gate.
    # The simulator's time is simulated: the stored baseline holds on another CPU than the one it
    # was recorded on, so the CPU model may differ (every other part of the setup may not).
    return ucmctl("bench", "compare", "benchmarks/baselines/ci-sim.json", str(new),
                  "--max-regression", "ttft_mean=50%,tpot_mean=50%,e2el_mean=50%", "--vary", "device",
                  "--junit", str(tmp_path / "junit.xml"), env=env)  # fmt: skip


def test_ci_suite_against_the_stored_baseline(tmp_path: Path) -> None:
    env = {**os.environ, "UCMCTL_HOME": str(tmp_path / "home")}
    gate = suite_and_gate(tmp_path, env, "1")
    if gate.returncode == 5:
        # A regression must show twice, as a CI gate on shared machines confirms one: the
        # ~100 ms ucm cells doubled once here while the machine was busy (203 ms, then 110-125 ms
        # in six reruns of the same code).
        first = gate.stdout
        gate = suite_and_gate(tmp_path, env, "2")
        assert gate.returncode == 0, f"first run:\n{first}\nconfirmation run:\n{gate.stdout}{gate.stderr}"
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "| ucm/1024 | ttft_mean |" in gate.stdout and "verdict" in gate.stdout
    assert "<testsuite" in (tmp_path / "junit.xml").read_text()
    assert ucmctl("status", env=env).stdout.strip() == "no deployments"  # the suite took it down
