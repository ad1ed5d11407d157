"""`python -m ucmctl ...` as a user runs it: the one command runner of the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


class Cli:
    """`python -m ucmctl ARGS` with a state folder of its own (UCMCTL_HOME) and, where given, an
    SSH config and more environment (a Slurm site's, a container runtime's). A traceback on its
    stderr fails the test: ucmctl prints none for a user's error."""

    def __init__(
        self,
        home: Path,
        ssh_config: Path | None = None,
        env: Mapping[str, str] | None = None,
        *,
        timeout: float = 180,
        cwd: Path | None = None,
    ) -> None:
        self.env = {**os.environ, **(env or {}), "UCMCTL_HOME": str(home)}
        if ssh_config is not None:
            self.env["UCMCTL_SSH_CONFIG"] = str(ssh_config)
        self.timeout = timeout
        self.cwd = cwd

    @staticmethod
    def argv(*args: str) -> list[str]:
        return [sys.executable, "-m", "ucmctl", *args]

    def __call__(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.argv(*args),
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            timeout=timeout or self.timeout,
        )
        assert "Traceback" not in done.stderr, done.stderr
        return done

    def popen(self, *args: str) -> subprocess.Popen[str]:
        """The command started, its output piped, for a test that acts while it runs."""
        return subprocess.Popen(
            self.argv(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=self.cwd,
        )
