"""A real Slurm on two network-namespace hosts (one per test module), and `ucmctl` as a user on
its login node runs it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.netns import Cluster, cluster_or_skip
from tests.support.slurm import Slurm, slurm_or_skip


@dataclass
class Site:
    hosts: Cluster
    slurm: Slurm


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with cluster_or_skip(2) as hosts, slurm_or_skip(hosts) as slurm:
        yield Site(hosts, slurm)


class Cli:
    """`python -m ucmctl ...` as a user on the login node runs it (SLURM_CONF is the site's)."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.env = {**env, "UCMCTL_HOME": str(home)}

    def __call__(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "ucmctl", *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout)  # fmt: skip
        assert "Traceback" not in done.stderr + done.stdout, done.stderr
        return done

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "ucmctl", *args], env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


@pytest.fixture
def cli(tmp_path: Path, site: Site) -> Cli:
    return Cli(tmp_path / "home", site.slurm.env)


def nodes(site: Site, names: list[str]) -> str:
    return "\n".join(f"  {n}: {{host: {site.hosts.host(n).address}, platform: cpu, python: {sys.executable}, "
                     f"workdir: {site.hosts.shared / 'work'}}}" for n in names)  # fmt: skip


def centralized(
    site: Site,
    name: str,
    *,
    cluster: str = "",
    prefill: str = "h1",
    per_node: int = 1,
    decode: str = "h2",
    flags: str = "{block-size: 16}",
    decode_flags: str | None = None,
) -> str:
    """A centralized simulator deployment on the site's h1/h2, its run directory and store on
    the folder every node shares."""
    return f"""
name: {name}
mode: centralized
engine: sim
model: {{path: sim-model}}
cluster: {{kind: slurm, partition: debug, time_limit: "30:00", wait_allocation: 60{cluster}}}
nodes:
{nodes(site, ["h1", "h2"])}
storage: {{storage_backends: {site.hosts.shared / name}, cache_buffer_capacity_gb: 0.25}}
prefill: {{nodes: [{prefill}], servers_per_node: {per_node}, port: 8100, flags: {flags}}}
decode: {{nodes: [{decode}], servers_per_node: {per_node}, port: 8200, flags: {decode_flags or flags}}}
proxy: {{node: h1, port: 8000}}
"""


def queued(site: Site) -> list[str]:
    """Jobs Slurm holds (pending, running, completing): not the finished ones it still lists."""
    return site.slurm.run("squeue", "-h", "-o", "%i").stdout.split()
