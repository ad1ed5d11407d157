from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.netns import Cluster, cluster_or_skip


@pytest.fixture(scope="module")
def hosts() -> Iterator[Cluster]:
    with cluster_or_skip(4) as c:
        yield c


class Cli:
    """`python -m ucmctl ...` as a user runs it, with its own state folder and SSH config."""

    def __init__(self, home: Path, ssh_config: Path) -> None:
        self.env = {**os.environ, "UCMCTL_HOME": str(home), "UCMCTL_SSH_CONFIG": str(ssh_config)}

    def __call__(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "ucmctl", *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout)  # fmt: skip
        assert "Traceback" not in done.stderr + done.stdout, done.stderr
        return done


@pytest.fixture
def cli(tmp_path: Path, hosts: Cluster) -> Cli:
    return Cli(tmp_path / "home", hosts.ssh_config)


def node_lines(c: Cluster, names: list[str], platform: str = "cpu") -> str:
    return "\n".join(
        f"  {n}: {{host: {c.host(n).address}, key: {c.key}, platform: {platform}, python: {sys.executable}}}"
        for n in names
    )


def mixed_sim(name: str, nodes: str, on: str, port: int) -> str:
    """A one-server mixed deployment of the simulator on node `on`; `nodes` as node_lines gives."""
    return f"""
name: {name}
mode: mixed
engine: sim
model: {{path: sim-model}}
nodes:
{nodes}
mixed: {{nodes: [{on}], port: {port}}}
"""


def write(tmp: Path, text: str) -> Path:
    """A topology file in the test's folder."""
    path = tmp / "topology.yaml"
    path.write_text(text)
    return path


def completion(url: str, prompt: list[int], max_tokens: int = 4) -> dict:
    """One /v1/completions of the simulator's model, its JSON answer."""
    body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        return r.read().decode()
