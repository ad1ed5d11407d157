"""Topologies of the simulator on a Slurm site's two hosts (tests/support/fixtures.py), and what
its queue holds."""

from __future__ import annotations

import sys

from tests.support.slurm import Site


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
