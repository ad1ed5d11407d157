"""The set-up installs what each command needs: the main job (run-default.sh) none of the test
infrastructure, the test command all of it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_INFRASTRUCTURE = {
    "openssh-server",
    "slurm-wlm",
    "munge",
    "podman",
    "docker.io",
    "glusterfs-server",
    "glusterfs-client",
    "prometheus",
    "systemd-container",
    "debootstrap",
}


def setup_options(script: str) -> list[str]:
    """The options `script` passes to scripts/setup.sh (its one call of it, after any
    environment assignments)."""
    text = (ROOT / "scripts" / script).read_text()
    calls = re.findall(r"^\s*(?:[A-Z_]+=\S*\s+)*bash scripts/setup\.sh(.*)$", text, re.M)
    assert len(calls) == 1, f"{script} calls setup.sh {len(calls)} times"
    return calls[0].split()


def setup(*args: str) -> subprocess.CompletedProcess[str]:
    script = str(ROOT / "scripts" / "setup.sh")
    return subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=30)


def packages(options: list[str]) -> set[str]:
    return set(setup("--list", *options).stdout.split())


def test_the_main_job_installs_no_test_infrastructure() -> None:
    options = setup_options("run-default.sh")
    assert options == ["--engine"]
    job = packages(options)
    assert {"g++", "python3-venv", "libnuma1"} <= job  # the native store's compiler; vLLM's CPU build
    assert not job & TEST_INFRASTRUCTURE


def test_the_test_command_installs_the_test_infrastructure() -> None:
    options = setup_options("test.sh")
    assert options == ["--engine", "--tests"]
    assert packages(options) >= TEST_INFRASTRUCTURE | packages(["--engine"])


def test_an_unknown_option_is_refused() -> None:
    done = setup("--list", "--gpu")
    assert done.returncode == 2
    assert "unknown option --gpu" in done.stderr
